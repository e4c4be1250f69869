"""Deadline propagation for requests (DECISIONS D4.3, D4.5, D4.8).

Mount the adapter on a session::

    import requests
    from timebound.propagation.requests import DeadlineAdapter

    session = requests.Session()
    adapter = DeadlineAdapter(timeout=5.0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)

Every attempt's timeout is ``min(static, remaining)``. The static timeout is the adapter's own
``timeout`` (a total per attempt) when given, else the call's ``timeout=`` (the larger of a
``(connect, read)`` pair). The connect and read timeouts are set to at most the time left, and the
body is read through a stream that checks the clock after every chunk, so the whole exchange is
bounded (a sync read cannot be interrupted: a server trickling bytes can overrun by at most one
read timeout). Errors are as for :mod:`timebound.propagation.httpx`; :class:`AttemptTimeout` is
also a ``requests.exceptions.Timeout``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

try:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.exceptions import ReadTimeoutError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.requests needs requests: pip install 'timebound[requests]'"
    ) from exc

from ..._core._body import read_prefix
from ..._core._durations import Duration
from ..._core._errors import DeadlineExceeded
from ...policies._policy import Policy
from ...telemetry._tracing import active as tracing_active
from ...telemetry._tracing import client_span
from .._breakdown_wire import BREAKDOWN_HEADER
from .._client import (
    REFUSAL_BODY_MAX,
    Attempt,
    AttemptTimeoutBase,
    begin,
    call_name,
    http_client_setup,
)
from .._codec import ABSOLUTE_HEADER, EXPIRED_HEADER, TIMEOUT_HEADER
from .._resilience import (
    DEFAULT_HEDGE_METHODS,
    DEFAULT_RETRY_STATUSES,
    FailedAnswer,
    Passed,
    mark_truncated,
)

__all__ = ["AttemptTimeout", "DeadlineAdapter"]

#: The chunk size a body is read in up to its cap (decoded bytes).
_CHUNK = 65536

_TIMEOUTS: tuple[type[BaseException], ...] = (requests.exceptions.Timeout, ReadTimeoutError)
#: The errors of an attempt that say the dependency failed (D3.17): the connection broke or
#: timed out. Any other error (a bad URL, a body that cannot be read twice) is the caller's.
_FAILURES: tuple[type[BaseException], ...] = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
)
#: What an attempt raises to the policy as it is (D3.17); any other error is handed back.
_RAISED: tuple[type[BaseException], ...] = (DeadlineExceeded, *_FAILURES)


class AttemptTimeout(AttemptTimeoutBase, requests.exceptions.Timeout):
    """The attempt's own timeout ran out (retryable, D2.5).

    Both a :class:`timebound.DeadlineExceeded` with ``source="attempt"`` and a
    :class:`requests.exceptions.Timeout`; ``remote`` is true for a server's "deadline expired"
    answer (D4.5 case 2).
    """

    def __init__(
        self,
        message: str,
        *,
        request: Any = None,
        remote: bool = False,
        timeout: float | None = None,
    ) -> None:
        AttemptTimeoutBase.__init__(self, message, remote=remote, timeout=timeout)
        self.request = request
        self.response = None


def _phases(timeout: Any) -> tuple[float | None, float | None]:
    if timeout is None:
        return (None, None)
    if isinstance(timeout, tuple):
        connect, read = timeout
        return (connect, read)
    if isinstance(timeout, int | float):
        return (float(timeout), float(timeout))
    # A urllib3 ``Timeout``: its total bounds both phases.
    total = getattr(timeout, "total", None)
    connect = getattr(timeout, "_connect", None)
    read = getattr(timeout, "_read", None)
    pair = [v if isinstance(v, int | float) else None for v in (connect, read)]
    if isinstance(total, int | float):
        pair = [total if v is None else min(v, total) for v in pair]
    return (pair[0], pair[1])


class DeadlineAdapter(HTTPAdapter):
    """A requests transport adapter that clamps, propagates and enforces the deadline.

    ``timeout``: a total per attempt (seconds, timedelta or ``"5s"``); other keyword arguments go
    to :class:`requests.adapters.HTTPAdapter` (``pool_maxsize``, ``max_retries`` …).
    ``ask_breakdown``: ask every callee for its breakdown (``X-Timebound-Breakdown: 1``); one
    that a callee sends is folded into the call's part whether asked or not (D13.5).
    ``policy`` and ``retry_statuses``: as for httpx's
    :class:`~timebound.propagation.httpx.DeadlineTransport` (D3.17). A hedged policy hedges
    the ``hedge_methods`` (GET, HEAD, OPTIONS; PUT and DELETE when named): the attempts race in
    threads and a loser's answer is closed, its connection released, when it arrives (D3.18).
    """

    def __init__(
        self,
        *,
        timeout: Duration | None = None,
        propagate_header: bool = True,
        timeout_header: str = TIMEOUT_HEADER,
        absolute_header: str | None = ABSOLUTE_HEADER,
        expired_header: str = EXPIRED_HEADER,
        what: str = "http request",
        ask_breakdown: bool = False,
        policy: Policy[Any] | None = None,
        retry_statuses: Iterable[int] = DEFAULT_RETRY_STATUSES,
        hedge_methods: Iterable[str] = DEFAULT_HEDGE_METHODS,
        **kwargs: Any,
    ) -> None:
        setup = http_client_setup(
            "DeadlineAdapter",
            timeout=timeout,
            propagate_header=propagate_header,
            timeout_header=timeout_header,
            absolute_header=absolute_header,
            expired_header=expired_header,
            what=what,
            ask_breakdown=ask_breakdown,
            policy=policy,
            retry_statuses=retry_statuses,
            hedge_methods=hedge_methods,
        )
        super().__init__(**kwargs)
        self._timeout = setup.timeout
        self._ask_breakdown = setup.ask_breakdown
        self._options = setup.options
        self._resilience = setup.resilience
        self._retry_statuses = setup.retry_statuses

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """Send the request under the effective deadline (see the module docstring): one
        attempt, or the policy's attempts when built with ``policy=`` (D3.17)."""
        resilience = self._resilience
        if resilience is None:
            return self._one(request, stream, timeout, verify, cert, proxies)
        response: requests.Response = resilience.run_sync(
            request.method or "GET",
            self._attempt,
            request,
            stream,
            timeout,
            verify,
            cert,
            proxies,
            release=_close,
        )
        return response

    def _attempt(
        self,
        request: requests.PreparedRequest,
        stream: bool,
        timeout: Any,
        verify: bool | str,
        cert: Any,
        proxies: Mapping[str, str] | None,
    ) -> requests.Response | Passed:
        """One attempt of a request under the policy (see ``propagation._resilience``): a
        copy, as each attempt writes its own deadline headers."""
        try:
            response = self._one(request.copy(), stream, timeout, verify, cert, proxies)
        except _RAISED:
            raise
        except Exception as exc:
            return Passed(exc)
        if response.status_code not in self._retry_statuses:
            return response
        try:
            # At most REFUSAL_BODY_MAX of the body (D4.14); read to its end, the connection
            # goes back to the pool, else it is closed with the rest unread.
            body, whole = read_prefix(response.iter_content(_CHUNK), REFUSAL_BODY_MAX)
        finally:
            response.close()
        # requests keeps a read body there itself (``Response.content``).
        response._content = body
        response._content_consumed = True
        if not whole:
            mark_truncated(response)
        raise FailedAnswer(
            response,
            self._options.what,
            status=response.status_code,
            headers=response.headers,
        )

    def _one(
        self,
        request: requests.PreparedRequest,
        stream: bool,
        timeout: Any,
        verify: bool | str,
        cert: Any,
        proxies: Mapping[str, str] | None,
    ) -> requests.Response:
        if not tracing_active():
            return self._send(request, stream, timeout, verify, cert, proxies)
        # With spans exported, a client span carrying the budget sent (D10.4).
        with client_span(request.method or "GET", request.url or "", request.headers) as answered:
            response = self._send(request, stream, timeout, verify, cert, proxies)
            sent = request.headers.get(self._options.timeout_header)
            answered(response.status_code, sent if isinstance(sent, str) else None)
            return response

    def _send(
        self,
        request: requests.PreparedRequest,
        stream: bool,
        timeout: Any,
        verify: bool | str,
        cert: Any,
        proxies: Mapping[str, str] | None,
    ) -> requests.Response:
        connect, read = _phases(timeout)
        if self._timeout is not None:
            static: float | None = self._timeout
        else:
            configured = [v for v in (connect, read) if v is not None]
            static = max(configured) if configured else None
        attempt = begin(
            static,
            self._options,
            functools.partial(AttemptTimeout, request=request),
            _TIMEOUTS,
        )
        url = urlsplit(request.url or "")
        attempt.name = call_name(request.method or "GET", url.hostname or "", url.path)  # D13
        for name, value in attempt.headers():
            request.headers[name] = value
        if self._ask_breakdown:
            request.headers[BREAKDOWN_HEADER] = "1"
        seconds = attempt.clamped.seconds
        if seconds is not None:
            timeout = (
                seconds if connect is None else min(connect, seconds),
                seconds if read is None else min(read, seconds),
            )
        try:
            with attempt.boundary():
                response = super().send(
                    request,
                    stream=stream,
                    timeout=timeout,
                    verify=verify,
                    cert=cert,
                    proxies=dict(proxies) if proxies is not None else None,
                )
        except BaseException as exc:
            attempt.part(type(exc).__name__)  # D13: a call that got no answer
            raise
        # D13: the call is a part of our breakdown, the callee's own (if it sent one) inside it.
        attempt.answered(response.status_code, response.headers.get(BREAKDOWN_HEADER))
        refusal = attempt.refusal(
            response.status_code, response.headers.get(self._options.expired_header)
        )
        if refusal is not None:
            # Read the short body so the connection returns to the pool intact (D4.8); a long
            # one is closed unread.
            try:
                read_prefix(response.iter_content(_CHUNK), REFUSAL_BODY_MAX)
            finally:
                response.close()
            raise attempt.refused(refusal)
        if attempt.end is not None:
            response.raw = _BoundedRaw(response.raw, attempt)
        return response


def _close(response: requests.Response) -> None:
    """Release the answer of a hedge that lost (D3.18): its body unread, the connection is
    closed and its pool slot given back."""
    try:
        response.close()
    except Exception:  # nobody to tell: the caller has its answer already
        pass


class _BoundedRaw:
    """urllib3's response, with the body read chunk by chunk under the attempt's end."""

    def __init__(self, raw: Any, attempt: Attempt) -> None:
        self._raw = raw
        self._attempt = attempt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    @contextmanager
    def _read(self) -> Iterator[None]:
        """One read under the attempt's boundary; a cut leaves the connection unusable."""
        try:
            with self._attempt.boundary():
                yield
                self._attempt.check()
        except DeadlineExceeded:
            if self._attempt.expired():
                # The body is unread: this connection cannot be reused; close it, free its slot.
                self._raw.close()
                self._raw.release_conn()
            raise

    def stream(
        self, amt: int | None = 2**16, decode_content: bool | None = None
    ) -> Iterator[bytes]:
        chunks = self._raw.stream(amt, decode_content=decode_content)
        while True:
            with self._read():
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        with self._read():
            data: bytes = self._raw.read(*args, **kwargs)
        return data
