"""The HTTP side: the host's connector to a remote service, and the ASGI app a service mounts.

:class:`HttpConnector` polls a connector's ``status_href`` and posts to its ``cancel_href``
through timebound's httpx transport, so each call carries and enforces the poll's deadline.
:func:`status_app` serves the fixed routes over a :class:`~timebound.deferred.Registry`:

- ``POST /v1/operations/{kind}``: start an operation of a :class:`Service` (202 Accepted);
- ``GET /v1/deferred-operations/{id}/status``: its status document (404 never issued, 410 gone);
- ``POST /v1/deferred-operations/{id}/cancel``: cancel it.

A 429 or 503 keeps its meaning (overload, with ``Retry-After``); it is never a deferral.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from .._core._body import (
    DEFAULT_MAX_BYTES,
    Disconnected,
    TooLarge,
    asgi_chunks,
    declared_too_large,
    read_capped,
)
from .._core._errors import ConfigurationError
from .._core._problem import PROBLEM_JSON, problem_bytes
from .._json import JSONError
from .._json import loads as loads_json
from ._contract import TERMINAL
from ._poller import PollRefused, TransientPollError
from ._registry import Gone, IdempotencyConflict, Operation, Registry
from ._service import Overloaded, Service, UnknownKind

__all__ = ["HttpConnector", "origin_of", "same_origin", "status_app"]

_STATUS = re.compile(r"^/v1/deferred-operations/([^/]+)/(status|cancel)$")
_START = re.compile(r"^/v1/operations/([^/]+)$")
_WAIT = re.compile(r"(?:^|[,;\s])wait=(\d{1,9})(?:$|[,;\s])")
_MAX_BODY = 1024 * 1024


def origin_of(url: str) -> str:
    """``scheme://host:port`` of an absolute URL, as written (the origin hrefs are pinned to)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def same_origin(origin: str, href: str) -> bool:
    """Whether ``href`` (absolute, or relative to ``origin``) stays on ``origin`` (D7.12).

    The one check of where a connector's hrefs may lead: the host follows them with the poll's
    headers, so an href to another origin would make it a proxy to anywhere (blind SSRF).
    """
    parts = urlsplit(urljoin(origin + "/", href))
    return f"{parts.scheme}://{parts.netloc}" == origin


class HttpConnector:
    """Polls and cancels operations over HTTP with an ``httpx.AsyncClient``.

    Give the client a :class:`timebound.propagation.httpx.AsyncDeadlineTransport` (the default
    client does) so the poller's deadline bounds and travels with each call; relative
    ``status_href``/``cancel_href`` are resolved against ``base_url``. An href on another origin
    than ``base_url``'s is never followed (``foreign-href``, D7.12), and an answer is read with a
    cap of ``max_bytes`` (``too-large``, D6.21): either fails the operation.
    """

    def __init__(
        self, base_url: str, client: Any = None, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        import httpx

        from ..propagation.httpx import AsyncDeadlineTransport

        if max_bytes < 1:
            raise ConfigurationError("max_bytes must be >= 1", option="max_bytes")
        self.base_url = base_url
        self.origin = origin_of(base_url)
        self.max_bytes = max_bytes
        self._client = (
            client
            if client is not None
            else httpx.AsyncClient(base_url=base_url, transport=AsyncDeadlineTransport())
        )
        self._owns = client is None

    async def aclose(self) -> None:
        if self._owns:
            await self._client.aclose()

    async def status(self, op: Operation) -> object:
        if op.status_href is None:
            raise TransientPollError("no-status-href", "the operation has no status_href")
        return await self._call("GET", op.status_href)

    async def cancel(self, op: Operation) -> object:
        assert op.cancel_href is not None
        return await self.cancel_at(op.cancel_href)

    async def cancel_at(self, cancel_href: str) -> object:
        """Ask for a cancellation at ``cancel_href`` (an operation that was never registered:
        a handle answered to a call made in sync mode); the status document answered."""
        return await self._call("POST", cancel_href)

    async def _call(self, method: str, href: str) -> object:
        import httpx

        if not same_origin(self.origin, href):
            raise PollRefused(
                "foreign-href",
                f"{method} {_short(href)}: not on the connector's origin {self.origin}",
            )
        try:
            # Never a redirect, whatever the client was made with: it could lead a poll off
            # the origin the href was checked against (D7.12).
            async with self._client.stream(method, href, follow_redirects=False) as response:
                if 300 <= response.status_code < 400:
                    location = response.headers.get("location", "")
                    raise PollRefused(
                        "redirect-refused",
                        f"{method} {_short(href)}: answered {response.status_code} to "
                        f"{_short(location)!r}; redirects are not followed",
                    )
                if response.status_code == 429 or response.status_code >= 500:
                    raise TransientPollError(
                        f"poll-http-{response.status_code}",
                        f"{method} {href}: {response.status_code}",
                    )
                declared_too_large(
                    response.headers.get("content-length"), self.max_bytes, f"{method} {href}"
                )
                data = await read_capped(
                    response.aiter_bytes(), self.max_bytes, what=f"the answer to {method} {href}"
                )
                status = response.status_code
        except TooLarge as exc:
            raise PollRefused(exc.code, str(exc)) from None
        except httpx.TransportError as exc:
            code = "poll-timeout" if isinstance(exc, httpx.TimeoutException) else "poll-unreachable"
            raise TransientPollError(code, f"{method} {href}: {type(exc).__name__}") from None
        try:
            doc = loads_json(data, what=f"the answer to {method} {href}")
        except JSONError:
            doc = None  # not JSON, or nested too deep: the registry rejects it (schema)
        if status in _ENDED:
            # No later poll can change these (D7.13): the owner pruned the operation after its
            # retention (D7.5) or never knew it. Polling on until expiry would only hide that.
            raise PollRefused(_ENDED[status], f"{method} {href}: {status}{_detail(doc)}")
        if 400 <= status < 500 and method == "GET":
            # Not a status document; maybe a credential being rotated: back off and try again.
            raise TransientPollError(
                f"poll-http-{status}", f"{method} {href}: {status}{_detail(doc)}"
            )
        return doc


#: Answers that end an operation here, by HTTP status, with the code it fails with.
_ENDED = {404: "remote-unknown", 410: "remote-gone"}


def _detail(doc: object) -> str:
    """A problem document's ``detail`` (RFC 9457), shortened, for the refusal's message."""
    detail = doc.get("detail") if isinstance(doc, dict) else None
    if not isinstance(detail, str) or not detail.isprintable():
        return ""
    return f" ({_short(detail)})"


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


# The ASGI app ---------------------------------------------------------------------------


async def _send_json(
    send: Any, status: int, body: object, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": data})


async def _send_problem(
    send: Any,
    status: int,
    detail: str,
    instance: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    **extra: Any,
) -> None:
    """An error as the host answers every error (D8.2, D8.23): an RFC 9457 problem document,
    ``application/problem+json``, with the path asked as its ``instance`` and a stable ``code``."""
    data = problem_bytes(status, detail, instance, **extra)
    head = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(data)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": data})


async def _send_gone(send: Any, op_id: str, path: str, exc: Gone) -> None:
    await _send_problem(
        send, 410, f"deferred operation {op_id!r} is no longer retained", path, code=exc.code
    )


async def _send_unknown(send: Any, op_id: str, path: str) -> None:
    await _send_problem(
        send, 404, f"no deferred operation {op_id!r}", path, code="unknown-operation"
    )


async def _read_body(receive: Any) -> bytes | None:
    try:
        return await read_capped(asgi_chunks(receive), _MAX_BODY, what="the body")
    except (TooLarge, Disconnected):
        return None


def status_app(registry: Registry, service: Service | None = None) -> Any:
    """An ASGI app serving ``registry``'s operations (and starting ``service``'s, if given)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        m = _STATUS.match(path)
        if m is not None:
            op_id, action = unquote(m.group(1)), m.group(2)
            want = "GET" if action == "status" else "POST"
            if method != want:
                await _send_problem(
                    send,
                    405,
                    f"method {method} is not allowed here; use {want}",
                    path,
                    [(b"allow", want.encode())],
                )
                return
            if action == "status":
                await _status(send, op_id, path)
            else:
                await _cancel(send, op_id, path)
            return
        m = _START.match(path)
        if m is not None and service is not None:
            if method != "POST":
                await _send_problem(
                    send,
                    405,
                    f"method {method} is not allowed here; use POST",
                    path,
                    [(b"allow", b"POST")],
                )
                return
            await _start(send, receive, unquote(m.group(1)), headers, path)
            return
        await _send_problem(send, 404, "no such route", path)

    async def _status(send: Any, op_id: str, path: str) -> None:
        try:
            doc = await registry.status_document(op_id)
        except Gone as exc:
            await _send_gone(send, op_id, path, exc)
            return
        if doc is None:
            await _send_unknown(send, op_id, path)
            return
        extra = []
        if doc["status"] not in TERMINAL:
            extra.append((b"retry-after", str(doc["retry_after_seconds"]).encode()))
        await _send_json(send, 200, doc, extra)

    async def _cancel(send: Any, op_id: str, path: str) -> None:
        try:
            op = await registry.get(op_id)
        except Gone as exc:
            await _send_gone(send, op_id, path, exc)
            return
        if op is None:
            await _send_unknown(send, op_id, path)
            return
        if op.cancel_href is None and not op.terminal:
            reason = op.cancel_reason or "no cancel offered"
            await _send_problem(send, 409, f"not cancelable: {reason}", path, code="not-cancelable")
            return
        if service is not None and not op.terminal:
            await service.cancel(op_id)
        await _status(send, op_id, path)

    async def _start(
        send: Any, receive: Any, kind: str, headers: dict[str, str], path: str
    ) -> None:
        assert service is not None
        body = await _read_body(receive)
        if body is None:
            await _send_problem(
                send, 413, f"the body is over {_MAX_BODY} bytes", path, code=TooLarge.code
            )
            return
        try:
            payload = loads_json(body, what="the body") if body else None
        except JSONError as exc:
            await _send_problem(send, 400, str(exc), path, code=exc.code)
            return
        prefer = headers.get("prefer", "")
        wait = _WAIT.search(prefer)
        try:
            doc = await service.start(
                kind,
                payload,
                idempotency_key=headers.get("idempotency-key"),
                wait=None if wait is None else int(wait.group(1)),
            )
        except UnknownKind as exc:
            await _send_problem(send, 404, f"no operation kind {kind!r} here", path, code=exc.code)
            return
        except IdempotencyConflict as exc:
            await _send_problem(send, 409, str(exc), path, code=exc.code)
            return
        except Overloaded as exc:
            retry = str(exc.retry_after_s).encode()
            await _send_problem(send, 503, str(exc), path, [(b"retry-after", retry)], code=exc.code)
            return
        extra = [
            (b"location", doc["status_href"].encode()),
            (b"retry-after", str(doc["retry_after_seconds"]).encode()),
        ]
        if "respond-async" in prefer:
            extra.append((b"preference-applied", b"respond-async"))
        await _send_json(send, 202, doc, extra)

    return app


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
