"""``Client`` and ``AsyncClient``: the host's API from Python (docs/host.md "Client and CLI").

Both speak through timebound's own httpx transports, so the calling code's deadline reaches
the host (``X-YaTaxi-Client-TimeoutMs``) and bounds every call, event streams included (D8.15)::

    import timebound
    from timebound.host import Client

    with Client("http://127.0.0.1:8080", token="…") as client:
        run_id = client.start("quick", {"n": 1}, idempotency_key="order-42")
        with timebound.fail_after(30):
            detail = client.wait(run_id)

Errors: a problem document from the host raises a :class:`HostError` subclass carrying its
status and code; the deadline raises :class:`~timebound.DeadlineExceeded` (never retried, never
before the deadline: when the host ends an event stream at it a moment early by our clock, the
client waits that moment out).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Self, cast

import httpx

from .._core import _clock
from .._core._deadline import Deadline
from .._core._durations import Duration, to_seconds
from .._core._scopes import acheckpoint, checkpoint, remaining
from ..propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from ._wire import (
    Call,
    Event,
    OperationDetail,
    OperationPage,
    PollOutcome,
    RunDetail,
    RunPage,
    SseParser,
    calls,
    numbered,
    raise_for_problem,
    wire_event,
)

__all__ = ["DEFAULT_URL", "AsyncClient", "Client"]

#: Where a client talks to when given no URL and ``TIMEBOUND_URL`` is unset.
DEFAULT_URL = "http://127.0.0.1:8080"
# Attempts of a start whose answer was lost on the way (a connection error, not a timeout): its
# idempotency key makes the repeat return the run the first one started (D8.15).
_START_ATTEMPTS = 3
# An event stream ends only with its run or the caller's deadline: no phase timeout applies.
_STREAM_TIMEOUT = httpx.Timeout(None)


def _base(url: str | None, token: str | None) -> tuple[str, dict[str, str]]:
    url = url or os.environ.get("TIMEBOUND_URL") or DEFAULT_URL
    token = token if token is not None else os.environ.get("TIMEBOUND_TOKEN") or None
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return url.rstrip("/"), headers


def _request_args(call: Call) -> dict[str, Any]:
    args: dict[str, Any] = {"params": call.query or None, "headers": call.headers or None}
    if call.body is not None:
        args["json"] = call.body
    return args


def _decode(response: httpx.Response) -> Any:
    raise_for_problem(
        response.status_code, response.headers.get("content-type", ""), response.content
    )
    return response.json()


def _left_after_cut(state: _Streamed) -> float | None:
    """After a stream the host ended at our deadline (D8.3): the time our own clock still gives
    (a moment, as the header was relative), to wait out before raising, never early (D1.3);
    ``None`` when the stream ended otherwise or we have no deadline (then follow it again)."""
    if state.kind_ended != "deadline":
        return None
    state.done, state.kind_ended = False, ""
    return remaining()


class _Streamed:
    """Turns a stream's lines into events; ``done`` once the host says the run ended."""

    def __init__(self, after: int) -> None:
        self.seq, self.done, self.kind_ended = after, False, ""
        self._parser = SseParser()

    def feed(self, line: str) -> list[Event]:
        out: list[Event] = []
        for message in self._parser.feed(line):
            if message.event in ("end", "deadline"):
                self.done, self.kind_ended = True, message.event
                continue
            if message.id is None or not message.id.isdigit():
                continue
            raw = json.loads(message.data) if message.data else {}
            raw.setdefault("kind", message.event)
            self.seq = int(message.id)
            out.append(wire_event(self.seq, raw))
        return out


class Client:
    """A synchronous client of a timebound host.

    ``url`` defaults to ``TIMEBOUND_URL`` (else ``http://127.0.0.1:8080``), ``token`` to
    ``TIMEBOUND_TOKEN``; ``timeout`` bounds each call (a duration; the calling code's deadline
    bounds it further). ``transport`` replaces the network (tests); it is wrapped in the
    deadline transport all the same.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: Duration = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, headers = _base(url, token)
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=to_seconds(timeout, option="timeout", allow_zero=False),
            transport=DeadlineTransport(transport, what="timebound host call"),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> Any:
        return _decode(self._http.request(call.method, call.path, **_request_args(call)))

    # -- runs

    def start(
        self,
        definition_id: str,
        input: Any = None,
        *,
        deadline: Deadline | Duration | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run of ``definition_id``'s latest version; its id. A lost answer is asked
        again under the same idempotency key, which returns the same run (never a second one).
        ``deadline`` (a duration such as ``"30s"``, seconds, a timedelta, or a
        :class:`~timebound.Deadline`) bounds the run below its definition's timeout."""
        call = calls.start(
            definition_id, input, deadline=deadline, idempotency_key=idempotency_key, run_id=run_id
        )
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                answer = self._send(call)
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.TimeoutException) or attempt == _START_ATTEMPTS:
                    raise
                checkpoint()
                continue
            return cast(str, answer["run_id"])
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, run_id: str) -> RunDetail:
        """The run, its tokens, timeouts, the bound that fired and its timeline."""
        return cast(RunDetail, self._send(calls.get_run(run_id)))

    def runs(
        self, *, status: str | None = None, definition: str | None = None, cursor: str | None = None
    ) -> RunPage:
        """One page of runs, newest first; ``next_cursor`` asks for the next."""
        return cast(RunPage, self._send(calls.list_runs(status, definition, cursor)))

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a running run (:class:`HostConflict` if it has ended)."""
        return cast(dict[str, Any], self._send(calls.cancel_run(run_id)))

    def retry(
        self,
        run_id: str,
        *,
        reason: str,
        from_node: str | None = None,
        from_start: bool = False,
        operator: str | None = None,
    ) -> dict[str, Any]:
        """Run a failed or timed-out run again from the node that failed (or ``from_node``, or
        the start), with a fresh workflow timeout; ``{run_id, status, from_node}``. A run that
        did not fail is a :class:`HostConflict` with code ``run-not-failed`` (D6.25)."""
        call = calls.retry_run(run_id, reason, from_node, from_start, operator)
        return cast(dict[str, Any], self._send(call))

    def terminate(self, run_id: str, *, reason: str, operator: str | None = None) -> dict[str, Any]:
        """End a running run failed at once (retryable, unlike a cancel); an ended run is a
        :class:`HostConflict` with code ``run-ended``."""
        return cast(dict[str, Any], self._send(calls.terminate_run(run_id, reason, operator)))

    def extend(
        self,
        run_id: str,
        *,
        by: Duration,
        reason: str,
        node: str | None = None,
        operator: str | None = None,
    ) -> dict[str, Any]:
        """Move the run's deadline (or ``node``'s live tokens') later by ``by`` (seconds, a
        timedelta or ``"5min"``), within the host's ``max_extension``; refusals are
        :class:`HostConflict`\\ s with codes such as ``over-cap`` or ``run-ended`` (D6.27)."""
        call = calls.extend_run(run_id, by, reason, node, operator)
        return cast(dict[str, Any], self._send(call))

    def events(self, run_id: str) -> list[Event]:
        """The run's events so far."""
        return numbered(self._send(calls.events(run_id))["events"])

    def follow(self, run_id: str, *, after: int = 0) -> Iterator[Event]:
        """The run's events after number ``after`` as they happen, until the run ends; a broken
        stream is resumed where it stopped (``Last-Event-ID``)."""
        state = _Streamed(after)
        while not state.done:
            call = calls.follow(run_id, state.seq)
            with self._http.stream(
                call.method, call.path, headers=call.headers, timeout=_STREAM_TIMEOUT
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _decode(response)
                for line in response.iter_lines():
                    yield from state.feed(line)
                    if state.done:
                        break
            left = _left_after_cut(state)
            if left is not None:
                _clock.sleep(left)
            checkpoint()

    def wait(self, run_id: str) -> RunDetail:
        """Wait for the run to end (bounded by the calling code's deadline); its detail."""
        for _ in self.follow(run_id, after=len(self._send(calls.events(run_id))["events"])):
            pass
        return self.get(run_id)

    # -- definitions

    def definitions(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._send(calls.definitions())["definitions"])

    def put_definition(self, definition: dict[str, Any]) -> dict[str, Any]:
        """Store a definition version for every host and worker on the store."""
        return cast(dict[str, Any], self._send(calls.put_definition(definition)))

    # -- deferred operations

    def operations(
        self, *, status: str | None = None, module: str | None = None, cursor: str | None = None
    ) -> OperationPage:
        return cast(OperationPage, self._send(calls.operations(status, module, cursor)))

    def operation(self, op_id: str) -> OperationDetail:
        return cast(OperationDetail, self._send(calls.operation(op_id)))

    def poll(self, op_id: str) -> PollOutcome:
        """Poll the operation now through the host's connector."""
        return cast(PollOutcome, self._send(calls.poll(op_id)))

    def cancel_operation(self, op_id: str) -> dict[str, Any]:
        """Ask the operation's connector to cancel it (:class:`HostConflict` if it cannot)."""
        return cast(dict[str, Any], self._send(calls.cancel_operation(op_id)))


class AsyncClient:
    """The asynchronous twin of :class:`Client` (the same methods, awaited; ``follow`` is an
    async iterator)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: Duration = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, headers = _base(url, token)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=to_seconds(timeout, option="timeout", allow_zero=False),
            transport=AsyncDeadlineTransport(transport, what="timebound host call"),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> Any:
        return _decode(await self._http.request(call.method, call.path, **_request_args(call)))

    async def start(
        self,
        definition_id: str,
        input: Any = None,
        *,
        deadline: Deadline | Duration | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """See :meth:`Client.start`."""
        call = calls.start(
            definition_id, input, deadline=deadline, idempotency_key=idempotency_key, run_id=run_id
        )
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                answer = await self._send(call)
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.TimeoutException) or attempt == _START_ATTEMPTS:
                    raise
                await acheckpoint()
                continue
            return cast(str, answer["run_id"])
        raise AssertionError("unreachable")  # pragma: no cover

    async def get(self, run_id: str) -> RunDetail:
        return cast(RunDetail, await self._send(calls.get_run(run_id)))

    async def runs(
        self, *, status: str | None = None, definition: str | None = None, cursor: str | None = None
    ) -> RunPage:
        return cast(RunPage, await self._send(calls.list_runs(status, definition, cursor)))

    async def cancel(self, run_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.cancel_run(run_id)))

    async def retry(
        self,
        run_id: str,
        *,
        reason: str,
        from_node: str | None = None,
        from_start: bool = False,
        operator: str | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Client.retry`."""
        call = calls.retry_run(run_id, reason, from_node, from_start, operator)
        return cast(dict[str, Any], await self._send(call))

    async def terminate(
        self, run_id: str, *, reason: str, operator: str | None = None
    ) -> dict[str, Any]:
        """See :meth:`Client.terminate`."""
        call = calls.terminate_run(run_id, reason, operator)
        return cast(dict[str, Any], await self._send(call))

    async def extend(
        self,
        run_id: str,
        *,
        by: Duration,
        reason: str,
        node: str | None = None,
        operator: str | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Client.extend`."""
        call = calls.extend_run(run_id, by, reason, node, operator)
        return cast(dict[str, Any], await self._send(call))

    async def events(self, run_id: str) -> list[Event]:
        return numbered((await self._send(calls.events(run_id)))["events"])

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """See :meth:`Client.follow`."""
        state = _Streamed(after)
        while not state.done:
            call = calls.follow(run_id, state.seq)
            async with self._http.stream(
                call.method, call.path, headers=call.headers, timeout=_STREAM_TIMEOUT
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _decode(response)
                async for line in response.aiter_lines():
                    for event in state.feed(line):
                        yield event
                    if state.done:
                        break
            left = _left_after_cut(state)
            if left is not None:
                await asyncio.sleep(left)
            await acheckpoint()

    async def wait(self, run_id: str) -> RunDetail:
        """See :meth:`Client.wait`."""
        seen = len((await self._send(calls.events(run_id)))["events"])
        async for _ in self.follow(run_id, after=seen):
            pass
        return await self.get(run_id)

    async def definitions(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], (await self._send(calls.definitions()))["definitions"])

    async def put_definition(self, definition: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.put_definition(definition)))

    async def operations(
        self, *, status: str | None = None, module: str | None = None, cursor: str | None = None
    ) -> OperationPage:
        return cast(OperationPage, await self._send(calls.operations(status, module, cursor)))

    async def operation(self, op_id: str) -> OperationDetail:
        return cast(OperationDetail, await self._send(calls.operation(op_id)))

    async def poll(self, op_id: str) -> PollOutcome:
        return cast(PollOutcome, await self._send(calls.poll(op_id)))

    async def cancel_operation(self, op_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.cancel_operation(op_id)))
