"""Implementation of :mod:`timebound.propagation.redis` (DECISIONS D4.8).

A Redis command is never cancelled mid-flight: cancelling an in-flight command left replies on
the connection for the next caller (redis-py#2624, #2665; CVE-2023-28858/28859). So the
deadline acts at the two safe points only: *before sending* (fail fast, nothing sent) and *on
the wait for the reply* (the socket's read timeout is lowered to the time left). When that wait
ends at the deadline the reply may still be on its way, so the connection is closed, never put
back in use; the next command gets a fresh connection and its own reply.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ..._core._errors import DeadlineExceeded
from ...telemetry._tracing import CallSpan, active, call_span
from .._client import Attempt, AttemptTimeoutBase, begin
from ._common import options, run_guarded

try:
    import redis
    import redis.asyncio
    import redis.exceptions
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.redis needs redis-py: pip install 'timebound[redis]'"
    ) from exc

__all__ = ["AsyncDeadlineConnection", "DeadlineConnection", "afrom_url", "from_url"]

_WHAT: Final = "redis command"
#: A user's command, counted when the deadline lowers its read timeout.
_READ: Final = options("redis", _WHAT)
#: A send (its wait is counted at the read) or the connection handshake: bounded, not counted.
_QUIET: Final = options("redis", _WHAT, user=False)
_TIMEOUTS: Final = (redis.exceptions.TimeoutError, TimeoutError)
_SENTINEL: Any = getattr(redis.connection, "SENTINEL", object())
#: How long past the deadline a cancelled caller waits for a bounded read to end by itself (its
#: read timeout is the deadline) before it is cancelled from our side (a stuck connection).
DEFAULT_GRACE: Final = 1.0


class _NoRetryPastDeadline:
    """Wraps a connection's ``Retry`` so a spent deadline is never retried (D2.5).

    ``DeadlineExceeded`` is a builtin ``TimeoutError`` — which redis-py's ``Retry`` retries by
    default, with backoff sleeps in between. No attempt could finish in time, so it is raised
    at once instead.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def call_with_retry(
        self,
        do: Callable[[], Any],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> Any:
        def retryable(error: Exception) -> bool:
            if isinstance(error, DeadlineExceeded):
                return False
            return True if is_retryable is None else is_retryable(error)

        return self._inner.call_with_retry(
            do, fail, is_retryable=retryable, with_failure_count=with_failure_count
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __deepcopy__(self, memo: dict[int, Any]) -> _NoRetryPastDeadline:
        import copy

        return _NoRetryPastDeadline(copy.deepcopy(self._inner, memo))


class _GuardedRetry:
    """Connection mixin: whatever ``Retry`` redis-py or the caller sets (``Redis.set_retry``
    included) is wrapped in :class:`_NoRetryPastDeadline`."""

    _timebound_retry: Any = None

    @property
    def retry(self) -> Any:
        """redis-py's retry policy, wrapped so that a spent deadline is never retried."""
        return self._timebound_retry

    @retry.setter
    def retry(self, value: Any) -> None:
        if value is not None and not isinstance(value, _NoRetryPastDeadline):
            value = _NoRetryPastDeadline(value)
        self._timebound_retry = value


class _ReadAttempt:
    """Connection mixin: the attempt a reply's wait runs under, and the spans of the commands
    whose replies are due (D10.8)."""

    socket_timeout: float | None
    _timebound_setup: bool = False
    _timebound_spans: deque[CallSpan] | None = None

    def _timebound_command_span(self, args: tuple[Any, ...]) -> CallSpan | None:
        """The span of a command about to be sent (``None`` when nothing is traced, or for the
        connection's own handshake): named after the command, ended when its reply is read."""
        if not active() or self._timebound_setup or not args:
            return None
        name = args[0]
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        operation = str(name).split(" ", 1)[0].upper()
        return call_span(operation, **{"db.system": "redis", "db.operation.name": operation})

    def _timebound_sent(self, span: CallSpan) -> None:
        if self._timebound_spans is None:
            self._timebound_spans = deque()
        self._timebound_spans.append(span)

    def _timebound_reply_span(self) -> CallSpan | None:
        """The span of the command whose reply is read next."""
        spans = self._timebound_spans
        return spans.popleft() if spans else None

    def _timebound_drop_spans(self) -> None:
        """The connection closes: the replies still due will never be read."""
        spans, self._timebound_spans = self._timebound_spans, None
        for span in spans or ():
            span.end("ConnectionClosed")

    def _timebound_read(self) -> Attempt:
        """The read's attempt: the connection's ``socket_timeout`` clamped by the deadline (the
        handshake's replies bounded but not counted as the user's commands, D4.7).

        Raises when the deadline passed after the command was sent: the caller closes the
        connection, its reply still being due.
        """
        return begin(
            self.socket_timeout,
            _QUIET if self._timebound_setup else _READ,
            AttemptTimeoutBase,
            _TIMEOUTS,
        )


def _fail_fast() -> None:
    """Raise before a send when the deadline has passed (counted; nothing is sent)."""
    begin(None, _QUIET, AttemptTimeoutBase)


def _wait(attempt: Attempt) -> float:
    """The read timeout the deadline imposes: whole ms rounded up, never before the deadline."""
    ms = attempt.clamped.ms
    assert ms is not None
    return ms / 1000


class DeadlineConnection(_GuardedRetry, _ReadAttempt, redis.Connection):
    """A redis-py ``Connection`` that obeys the current deadline (TCP; ``redis://`` URLs).

    ``redis.Redis(connection_pool=redis.ConnectionPool(connection_class=DeadlineConnection,
    ...))`` or :func:`from_url`. Every command (also in pipelines):

    * fails fast with :class:`~timebound.DeadlineExceeded` (the binding bound's ``source``)
      when the deadline has passed — nothing is sent, and redis-py does not retry it;
    * waits for its reply no longer than the time left; if the deadline ends the wait, the
      connection is closed (its reply may still arrive) and ``DeadlineExceeded`` is raised,
      chained to redis-py's ``TimeoutError``, with the request marked.

    A tighter ``socket_timeout`` stays in force and fails as redis-py does. Reads with an
    explicit timeout of their own (pub/sub ``get_message``) are left to the caller.
    """

    def on_connect_check_health(self, check_health: bool = True) -> None:
        """redis-py's connection setup; its commands are bounded but not counted as the user's,
        and a setup cut part-way closes the connection."""
        self._timebound_setup = True
        try:
            super().on_connect_check_health(check_health)
        except BaseException:
            # The handshake sends several commands before reading their replies: cut part-way
            # (a spent deadline fails the next send fast), replies are still due, and redis-py
            # would keep the connection. Closed, so none reaches a later command.
            self.disconnect()
            raise
        finally:
            self._timebound_setup = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Send, unless the deadline has passed (then nothing is sent)."""
        _fail_fast()
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        """Send one command; with spans on, its span runs until its reply is read."""
        span = self._timebound_command_span(args)
        try:
            super().send_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except BaseException as exc:
            if span is not None:
                span.end(type(exc).__name__)
            raise
        if span is not None:
            self._timebound_sent(span)

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._timebound_drop_spans()
        super().disconnect(*args, **kwargs)  # type: ignore[no-untyped-call]

    def read_response(
        self,
        disable_decoding: bool = False,
        *,
        timeout: Any = _SENTINEL,
        disconnect_on_error: bool = True,
        push_request: bool = False,
    ) -> Any:
        """Read a reply, waiting no longer than the deadline allows (and end its command's
        span)."""
        span = self._timebound_reply_span()
        if span is None:
            return self._timebound_read_response(
                disable_decoding,
                timeout=timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        try:
            reply = self._timebound_read_response(
                disable_decoding,
                timeout=timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        except BaseException as exc:
            span.end(type(exc).__name__)
            raise
        span.end()
        return reply

    def _timebound_read_response(
        self,
        disable_decoding: bool = False,
        *,
        timeout: Any = _SENTINEL,
        disconnect_on_error: bool = True,
        push_request: bool = False,
    ) -> Any:
        attempt = None
        if timeout is _SENTINEL:
            try:
                attempt = self._timebound_read()
            except DeadlineExceeded:
                # Spent since the send: the reply is still due, so the connection is closed.
                self.disconnect()
                raise
        if attempt is None or not attempt.lowered:
            return super().read_response(
                disable_decoding,
                timeout=timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        try:
            with attempt.boundary():
                return super().read_response(
                    disable_decoding,
                    timeout=_wait(attempt),
                    disconnect_on_error=disconnect_on_error,
                    push_request=push_request,
                )
        except _TIMEOUTS:
            # The reply may still be on its way: this connection must never serve another
            # command (redis-py#2624, CVE-2023-28858). Closed here, reconnected on next use.
            self.disconnect()
            raise


class AsyncDeadlineConnection(_GuardedRetry, _ReadAttempt, redis.asyncio.Connection):
    """The ``redis.asyncio`` twin of :class:`DeadlineConnection`.

    ``redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(
    connection_class=AsyncDeadlineConnection, ...))`` or :func:`afrom_url`. The wait for a
    reply is bounded by lowering the read timeout, and a cancelling scope that fires at the
    deadline does not interrupt the read: the read ends by itself at the same deadline (the
    read runs as the one interruptible step of
    :func:`~timebound.propagation.db._common.run_guarded`, like a PostgreSQL statement), so
    the command is never cancelled mid-flight by the deadline. After any cancellation during a
    read the connection is closed: replies of the same batch may still be due.
    """

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        """redis-py's connection setup; its commands are bounded but not counted as the user's,
        and a setup cut part-way closes the connection."""
        self._timebound_setup = True
        try:
            await super().on_connect_check_health(check_health)
        except BaseException:
            # As in the sync twin: a handshake cut part-way leaves replies due; closed.
            await self.disconnect(nowait=True)
            raise
        finally:
            self._timebound_setup = False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Send, unless the deadline has passed (then nothing is sent)."""
        _fail_fast()
        await super().send_packed_command(command, check_health)

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        """Send one command; with spans on, its span runs until its reply is read."""
        span = self._timebound_command_span(args)
        try:
            await super().send_command(*args, **kwargs)
        except BaseException as exc:
            if span is not None:
                span.end(type(exc).__name__)
            raise
        if span is not None:
            self._timebound_sent(span)

    async def disconnect(
        self,
        nowait: bool = False,
        error: Exception | None = None,
        failure_count: int | None = None,
        health_check_failed: bool = False,
    ) -> None:
        self._timebound_drop_spans()
        await super().disconnect(nowait, error, failure_count, health_check_failed)

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        """Read a reply, waiting no longer than the deadline allows (and end its command's
        span)."""
        span = self._timebound_reply_span()
        if span is None:
            return await self._timebound_read_response(
                disable_decoding,
                timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        try:
            reply = await self._timebound_read_response(
                disable_decoding,
                timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        except BaseException as exc:
            span.end(type(exc).__name__)
            raise
        span.end()
        return reply

    async def _timebound_read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        attempt = None
        if timeout is None:
            try:
                attempt = self._timebound_read()
            except DeadlineExceeded:
                # Spent since the send: the reply is still due, so the connection is closed.
                await self.disconnect(nowait=True)
                raise
        if attempt is None or not attempt.lowered:
            return await super().read_response(
                disable_decoding,
                timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )

        async def read() -> Any:
            with attempt.boundary():
                return await super(AsyncDeadlineConnection, self).read_response(
                    disable_decoding,
                    None,
                    disconnect_on_error=disconnect_on_error,
                    push_request=push_request,
                )

        # An explicit ``timeout`` makes redis-py return None on expiry and keep the connection
        # (its pub/sub polling contract); the socket timeout path raises and disconnects, which
        # is what a command whose reply is still due needs.
        saved = self.socket_timeout
        self.socket_timeout = _wait(attempt)
        try:
            return await run_guarded(
                lambda guard: guard.statement(read), attempt, grace=DEFAULT_GRACE
            )
        except (*_TIMEOUTS, asyncio.CancelledError):
            # Even when this reply was read in full, the command may be one of a batch (a
            # pipeline, the connection handshake) whose caller now stops reading: the replies
            # still due must never reach another command. Closed, as redis-py does.
            await self.disconnect(nowait=True)
            raise
        finally:
            self.socket_timeout = saved


def from_url(url: str, **kwargs: Any) -> redis.Redis:
    """``redis.Redis.from_url`` with :class:`DeadlineConnection` (``redis://`` URLs)."""
    kwargs.setdefault("connection_class", DeadlineConnection)
    return redis.Redis.from_url(url, **kwargs)


def afrom_url(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """``redis.asyncio.Redis.from_url`` with :class:`AsyncDeadlineConnection`."""
    kwargs.setdefault("connection_class", AsyncDeadlineConnection)
    return redis.asyncio.Redis.from_url(url, **kwargs)
