"""Python connectors: a service offers deferred operations without writing the protocol.

``@service.operation("report.render")`` turns an async function into a deferred operation:
a start answers at once with ``deferred-operation.v1`` (the row is in the service's own
:class:`~timebound.deferred.Registry`, so its state survives a restart), the function runs in a
task bounded by the operation's lifetime, and its return value or failure becomes the status.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .._core._classify import classify
from .._core._deadline import Deadline
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError, DeadlineExceeded, TimeboundError
from .._core._renamed import Renamed, renamed
from .._core._scopes import fail_at
from .._store import Detached
from ._contract import OPERATION_SCHEMA, format_time
from ._registry import Registry, now_ms

__all__ = ["Overloaded", "Service", "UnknownKind"]

Work = Callable[[Any], Awaitable[Any]]

#: The source of the bound an operation's lifetime sets on its work.
_SOURCE = "deferred"


class UnknownKind(TimeboundError, LookupError):
    """No operation of this kind is offered."""

    code = "unknown-kind"


class Overloaded(TimeboundError):
    """The service takes no more work now (answered 503 with ``Retry-After``, never 202)."""

    code = "overloaded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.retry_after_s))


@dataclass(frozen=True)
class _Offer:
    work: Work
    retry_after_s: int
    ttl_s: int
    cancelable: bool


def _whole_seconds(name: str, value: Duration) -> int:
    """A span the document carries in whole seconds (``retry_after_seconds``, the lifetime)."""
    seconds = to_seconds(value, option=name, allow_zero=False)
    if not seconds.is_integer():
        raise ConfigurationError(
            f"Service.operation({name}=...) takes whole seconds (such as 1, '2min'), not {value!r}",
            option=name,
        )
    return int(seconds)


class Service:
    """A set of deferred operations served from ``registry`` (mount :func:`status_app`).

    ``max_running`` bounds the operations running at once; beyond it a start is refused with
    :class:`Overloaded` (HTTP 503 + ``Retry-After``).
    """

    def __init__(self, registry: Registry, *, max_running: int = 64, base_path: str = "") -> None:
        self.registry = registry
        self.max_running = max_running
        self.base_path = base_path.rstrip("/")
        self._offers: dict[str, _Offer] = {}
        self._tasks = Detached()  # the operations running, by id

    @renamed(retry_after_s=Renamed("retry_after"), ttl_s=Renamed("ttl"))
    def operation(
        self,
        kind: str,
        *,
        retry_after: Duration = 1,
        ttl: Duration = 900,
        cancelable: bool = True,
    ) -> Callable[[Work], Work]:
        """Offer the decorated ``async def work(payload) -> result`` as operation ``kind``.

        ``retry_after`` (the interval its answers suggest) and ``ttl`` (its lifetime) are
        durations of whole seconds, as the ``deferred-operation.v1`` document carries them."""
        offer_retry = _whole_seconds("retry_after", retry_after)
        offer_ttl = _whole_seconds("ttl", ttl)

        def register(work: Work) -> Work:
            if kind in self._offers:
                raise ValueError(f"operation kind {kind!r} is already offered")
            self._offers[kind] = _Offer(work, offer_retry, offer_ttl, cancelable)
            return work

        return register

    @renamed(wait_s=Renamed("wait"))
    async def start(
        self,
        kind: str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        wait: Duration | None = None,
    ) -> dict[str, Any]:
        """Accept work of ``kind``; return its ``deferred-operation.v1`` document at once.

        ``wait`` (the caller's ``Prefer: wait``) shortens the operation's lifetime to at most
        that, rounded up to whole seconds."""
        wait_s = None if wait is None else math.ceil(to_seconds(wait, option="wait"))
        offer = self._offers.get(kind)
        if offer is None:
            raise UnknownKind(kind)
        if len(self._tasks) >= self.max_running:
            raise Overloaded("too many operations running", offer.retry_after_s)
        op_id = f"deferred:{kind}:{uuid.uuid4().hex}"
        created = now_ms()
        ttl = offer.ttl_s if wait_s is None else max(1, min(offer.ttl_s, wait_s))
        base = f"{self.base_path}/v1/deferred-operations/{op_id}"
        doc: dict[str, Any] = {
            "schema": OPERATION_SCHEMA,
            "schema/v": 1,
            "status": "deferred",
            "operation/id": op_id,
            "operation/kind": kind,
            "retry_after_seconds": offer.retry_after_s,
            "created_at": format_time(created),
            "expires_at": format_time(created + ttl * 1000),
            "status_href": f"{base}/status",
        }
        if offer.cancelable:
            doc["cancel_href"] = f"{base}/cancel"
        else:
            doc["cancel/unavailable-reason"] = "this operation cannot be undone once started"
        op = await self.registry.register(
            doc, idempotency_key=idempotency_key, request=[kind, payload]
        )
        if op.id != op_id:  # an idempotent repeat: the same operation, nothing new runs
            doc.update(
                {
                    "operation/id": op.id,
                    "created_at": format_time(op.created_ms),
                    "expires_at": format_time(op.expires_ms),
                    "status_href": f"{self.base_path}/v1/deferred-operations/{op.id}/status",
                }
            )
            if op.cancel_href is not None:
                doc["cancel_href"] = op.cancel_href
            return doc
        # The registry's instants are the ones its status documents show.
        doc["created_at"] = format_time(op.created_ms)
        doc["expires_at"] = format_time(op.expires_ms)
        self._tasks.spawn(self._run(op_id, offer, payload, op.expires_ms), key=op_id)
        return doc

    async def _run(self, op_id: str, offer: _Offer, payload: Any, expires_ms: int) -> None:
        await self.registry.finish(op_id, "running")
        try:
            with fail_at(Deadline.from_epoch_ms(expires_ms), source=_SOURCE):
                result = await offer.work(payload)
        except DeadlineExceeded as exc:
            origin = classify(exc, own={_SOURCE})
            if exc.source == _SOURCE:
                # The lifetime itself ran out: only the expiry clock writes ``expired`` (D7.3).
                await self.registry.expire_due()
                return
            # A bound inside the work, or a downstream's spent deadline, fired before the
            # lifetime: the operation failed now, it does not linger until its expiry.
            code = "downstream-deadline-exceeded" if origin == "remote" else "timed-out"
            error = {"code": code, "message": "DeadlineExceeded", "retryable": False}
            await self.registry.finish(op_id, "failed", error=error)
            return
        except Exception as exc:  # the work's failure is the operation's status, not a crash
            # Only the error's type: its message may carry private data (privacy, D7).
            error = {"code": "operation-failed", "message": type(exc).__name__, "retryable": False}
            await self.registry.finish(op_id, "failed", error=error)
            return
        await self.registry.finish(op_id, "completed", result=result)

    async def cancel(self, op_id: str) -> None:
        """Cancel a running operation: its task stops and its status becomes ``cancelled``."""
        outcome = await self.registry.finish(
            op_id,
            "cancelled",
            error={"code": "cancelled", "message": "cancelled on request", "retryable": False},
        )
        task = self._tasks.get(op_id)
        if outcome.applied and task is not None:
            task.cancel()

    async def aclose(self) -> None:
        """Stop every running task (their rows stay; after a restart they expire on time)."""
        await self._tasks.cancel()
