"""A stored deferred operation: its row, its operator view, the history a change appends, and
the continuation format (D7.4).

Shared by the parts of :class:`~timebound.deferred.Registry`: its reads (``_reads.py``), its
transitions (``_transitions.py``) and its continuations (``_continuations.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._core import _clock
from .._core._breakdown import Breakdown
from .._core._errors import TimeboundError
from .._store import Store, Tx
from ..telemetry._durable import MAX_STATES, deferred_event, lifetime_breakdown
from ..telemetry._events import enabled
from ._contract import TERMINAL, format_time

__all__ = [
    "COLUMNS",
    "CONTINUATION_SCHEMA",
    "MAX_CONTINUATION_BYTES",
    "Gone",
    "IdempotencyConflict",
    "Operation",
    "StatusOutcome",
    "append_history",
    "check_continuation",
    "dump",
    "error_doc",
    "fetch_row",
    "now_ms",
    "row_op",
]

#: The one continuation format this version reads (D7.4).
CONTINUATION_SCHEMA = "timebound.continuation.v1"
MAX_CONTINUATION_BYTES = 64 * 1024

#: The columns of :class:`Operation` (never the continuation, result or error documents).
COLUMNS = (
    "id, kind, module, status, created_ms, updated_ms, expires_ms, connector_updated_ms, "
    "next_poll_ms, retry_after_s, attempts, status_href, cancel_href, cancel_reason, "
    "cancel_requested_ms, correlation_id, continuation_digest, resumed_ms, resume_error, "
    "last_error_code, result_digest, late_result_digest, status_digest, retain_until_ms, "
    "traceparent, expires_set_by"
)


def now_ms() -> int:
    """The current instant in epoch milliseconds (the durable form, D1.10)."""
    return _clock.wall_ms()


class StatusOutcome(NamedTuple):
    """What :meth:`Registry.apply_status` did: ``applied``, and the stable code of a rejection
    (or of an applied rewrite such as ``connector-expired``)."""

    applied: bool
    code: str | None


class IdempotencyConflict(TimeboundError, ValueError):
    """The idempotency key was already used for a different request."""

    code = "idempotency-conflict"


class Gone(TimeboundError, LookupError):
    """The operation was issued but its retention ended (HTTP 410)."""

    code = "gone"


@dataclass(frozen=True)
class Operation:
    """One operation as operators see it: states, instants and digests, never private content."""

    id: str
    kind: str
    module: str | None
    status: str
    created_ms: int
    updated_ms: int
    expires_ms: int
    next_poll_ms: int | None
    retry_after_s: int
    attempts: int
    status_href: str | None
    cancel_href: str | None
    cancel_reason: str | None
    cancel_requested_ms: int | None
    correlation_id: str | None
    continuation_digest: str | None
    resumed_ms: int | None
    resume_error: str | None
    last_error_code: str | None
    result_digest: str | None
    late_result_digest: str | None
    status_digest: str | None
    retain_until_ms: int | None
    connector_updated_ms: int | None
    #: The W3C trace context of the span that registered it, when spans are exported (D10.6).
    traceparent: str | None = None
    #: Where its lifetime was set (D2.8): ``connector``, ``action``, ``caller`` or ``host
    #: policy``; ``None`` for an operation registered before this was stored.
    expires_set_by: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def describe(self) -> dict[str, Any]:
        """The operator view (D7, privacy): no continuation, result or connector diagnostics."""
        return {
            "operation/id": self.id,
            "operation/kind": self.kind,
            "module": self.module,
            "status": self.status,
            "created_at": format_time(self.created_ms),
            "updated_at": format_time(self.updated_ms),
            "expires_at": format_time(self.expires_ms),
            "expires_set_by": self.expires_set_by,
            "next_poll_at": None if self.next_poll_ms is None else format_time(self.next_poll_ms),
            "attempts": self.attempts,
            "cancelable": self.cancel_href is not None,
            "cancel/unavailable-reason": self.cancel_reason,
            "last_error_code": self.last_error_code,
            "continuation_digest": self.continuation_digest,
            "result_digest": self.result_digest,
            "resumed": self.resumed_ms is not None,
        }


def row_op(row: dict[str, Any]) -> Operation:
    return Operation(**{k: row[k] for k in Operation.__dataclass_fields__})


def dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def error_doc(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    return {"code": code, "message": message, "retryable": retryable}


def check_continuation(continuation: object) -> str:
    """The continuation's JSON text, or a :class:`ValueError` naming what is wrong (D7.4)."""
    if not isinstance(continuation, dict):
        raise ValueError(f"a continuation is a JSON object, not {type(continuation).__name__}")
    if continuation.get("schema") != CONTINUATION_SCHEMA:
        raise ValueError(
            f"continuation schema {continuation.get('schema')!r} is not {CONTINUATION_SCHEMA!r}"
        )
    if not isinstance(continuation.get("resume_kind"), str):
        raise ValueError("a continuation names its resume_kind (a string)")
    try:
        text = dump(continuation)
    except (TypeError, ValueError) as exc:  # never pickle: JSON values only
        raise ValueError(f"a continuation is plain JSON: {exc}") from None
    if len(text.encode("utf-8")) > MAX_CONTINUATION_BYTES:
        raise ValueError(f"a continuation is at most {MAX_CONTINUATION_BYTES} bytes of JSON")
    return text


async def fetch_row(
    tx: Tx, store: Store, op_id: str, *, lock: bool = False
) -> dict[str, Any] | None:
    """The whole row of ``op_id`` (documents included), locked for the transaction with
    ``lock``."""
    clause = store.lock_clause() if lock else ""
    return await tx.fetchone(f"SELECT * FROM tb_deferred_ops WHERE id = ?{clause}", op_id)


async def append_history(
    tx: Tx,
    op_id: str,
    at: int,
    status: str,
    doc_digest: str | None,
    code: str | None,
    *,
    lifetime: Mapping[str, Any] | None = None,
) -> None:
    """Append a history entry (a digest and a code, never a document) in ``tx``; ``lifetime``
    is the row whose lifetime an expiry reports (D2.8)."""
    await tx.execute(
        "INSERT INTO tb_deferred_history (op_id, at_ms, status, digest, code) "
        "VALUES (?, ?, ?, ?, ?)",
        op_id,
        at,
        status,
        doc_digest,
        code,
    )
    if enabled():  # heard by telemetry listeners once the commit succeeded (D10.3)
        event = deferred_event(op_id, at, status, code, digest=doc_digest, lifetime=lifetime)
        if event.bound is not None:
            # D13: an expired operation's lifetime by the states it spent it in.
            event.bound.breakdown = await _lifetime_breakdown(tx, op_id, at)
        tx.announce(event)


async def _lifetime_breakdown(tx: Tx, op_id: str, end: int) -> Breakdown:
    """Where an operation's lifetime went: each stored status until the next one (D13)."""
    rows = await tx.fetch(
        "SELECT at_ms, status FROM tb_deferred_history WHERE op_id = ? ORDER BY seq LIMIT ?",
        op_id,
        MAX_STATES,
    )
    return lifetime_breakdown(rows, end)
