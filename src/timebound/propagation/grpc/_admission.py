"""Deadline-aware admission control for grpcio servers, sync and ``grpc.aio`` (DECISIONS D9).

The discipline is :class:`~timebound.admission.Admission`'s; these interceptors only map its
answers to gRPC: a hopeless call ends ``DEADLINE_EXCEEDED`` with the deadline-propagation details
(as an already-spent one does), a shed call ends ``UNAVAILABLE`` (gRPC's mapping of HTTP 503) with
the ``grpc-retry-pushback-ms`` trailer, gRPC's own way to tell a retrying client when to come back.
The handler never runs in either case (D9.1). The call's deadline is grpc's own, absolute since the
call arrived, so waiting in the queue spends it. Put the interceptor first in the list, so the
deadline interceptor runs only for admitted calls.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final

import grpc
import grpc.aio

from ..._core import _clock
from ...admission._controller import Admission, Ticket, Verdict
from ...admission._waiting import criticality, enter_async, enter_blocking
from ._interceptors import EXPIRED_DETAILS, _method_name, _received_deadline, _rewrap

__all__ = ["OVERLOADED_DETAILS", "admission_interceptor", "aio_admission_interceptor"]

OVERLOADED_DETAILS: Final = "Service overloaded"
PUSHBACK_KEY: Final = "grpc-retry-pushback-ms"
COMPONENT: Final = "grpc-server"


class _Base:
    def __init__(self, admission: Admission | None, critical_metadata: str | None) -> None:
        self.admission = Admission(component=COMPONENT) if admission is None else admission
        self._critical = critical_metadata.lower() if critical_metadata else None
        self._pushback = ((PUSHBACK_KEY, str(self.admission.config.retry_after * 1000)),)

    def _ticket(self, details: Any, context: Any) -> Ticket:
        critical = False
        if self._critical is not None:
            for key, value in details.invocation_metadata or ():
                if key == self._critical:
                    critical = criticality(value)
        left = _received_deadline(context.time_remaining())
        deadline = None if left is None else _clock.now() + left
        return Ticket(_method_name(details.method), deadline, critical=critical)

    def _release(self, ticket: Ticket, context: Any) -> None:
        left = _received_deadline(context.time_remaining())
        self.admission.release(ticket, _clock.now(), late=left is not None and left <= 0)


class _SyncAdmission(_Base, grpc.ServerInterceptor):  # type: ignore[misc]
    """See :func:`admission_interceptor`."""

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return handler

        def wrap(kind: str, behavior: Callable[[Any, Any], Any]) -> Any:
            if kind.endswith("_stream"):
                return self._stream(behavior, details)
            return self._unary(behavior, details)

        return _rewrap(handler, wrap)

    def _enter(self, details: Any, context: Any) -> Ticket:
        ticket = self._ticket(details, context)
        outcome = enter_blocking(self.admission, ticket)
        if outcome is Verdict.HOPELESS:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)
        elif outcome is not Verdict.ADMIT:
            context.set_trailing_metadata(self._pushback)
            context.abort(grpc.StatusCode.UNAVAILABLE, OVERLOADED_DETAILS)
        return ticket

    def _unary(self, behavior: Callable[[Any, Any], Any], details: Any) -> Any:
        def wrapped(request: Any, context: Any) -> Any:
            ticket = self._enter(details, context)
            try:
                return behavior(request, context)
            finally:
                self._release(ticket, context)

        return wrapped

    def _stream(self, behavior: Callable[[Any, Any], Any], details: Any) -> Any:
        def wrapped(request: Any, context: Any) -> Iterator[Any]:
            ticket = self._enter(details, context)
            try:
                yield from behavior(request, context)
            finally:
                self._release(ticket, context)

        return wrapped


class _AioAdmission(_Base, grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See :func:`aio_admission_interceptor`."""

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return handler

        def wrap(_kind: str, behavior: Any) -> Any:
            if inspect.isasyncgenfunction(behavior):
                return self._asyncgen(behavior, details)
            if inspect.iscoroutinefunction(behavior):
                return self._coroutine(behavior, details)
            # A sync handler under grpc.aio runs in grpc's executor: left alone, as the
            # deadline interceptor leaves it.
            return None

        return _rewrap(handler, wrap)

    async def _enter(self, details: Any, context: Any) -> Ticket:
        ticket = self._ticket(details, context)
        outcome = await enter_async(self.admission, ticket)
        if outcome is Verdict.HOPELESS:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)
        elif outcome is not Verdict.ADMIT:
            context.set_trailing_metadata(self._pushback)
            await context.abort(grpc.StatusCode.UNAVAILABLE, OVERLOADED_DETAILS)
        return ticket

    def _coroutine(
        self, behavior: Callable[[Any, Any], Awaitable[Any]], details: Any
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def wrapped(request: Any, context: Any) -> Any:
            ticket = await self._enter(details, context)
            try:
                return await behavior(request, context)
            finally:
                self._release(ticket, context)

        return wrapped

    def _asyncgen(
        self, behavior: Callable[[Any, Any], AsyncIterator[Any]], details: Any
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def wrapped(request: Any, context: Any) -> AsyncIterator[Any]:
            ticket = await self._enter(details, context)
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                self._release(ticket, context)

        return wrapped


def admission_interceptor(
    admission: Admission | None = None, *, critical_metadata: str | None = None
) -> grpc.ServerInterceptor:
    """A ``grpc.ServerInterceptor`` admitting calls under ``admission`` (D9).

    ``grpc.server(executor, interceptors=[admission_interceptor(adm), server_interceptor()])``.
    Calls wait in grpc's thread-pool threads, so give the executor more workers than the limit
    plus the queue. ``critical_metadata``: a metadata key whose value ``critical`` lets a call in
    first (off by default; set it only where a trusted proxy sets or strips it).
    """
    return _SyncAdmission(admission, critical_metadata)


def aio_admission_interceptor(
    admission: Admission | None = None, *, critical_metadata: str | None = None
) -> grpc.aio.ServerInterceptor:
    """The ``grpc.aio`` twin of :func:`admission_interceptor` (coroutine and async-generator
    handlers; a sync handler under ``grpc.aio`` is passed through)."""
    return _AioAdmission(admission, critical_metadata)
