"""The durable registry of deferred operations and its host-enforced state machine (D7.2-D7.5).

One row per operation in the shared store (SQLite or PostgreSQL), keyed by the connector's
``operation/id``. Every change is one transaction that locks the row first, so a status, a
cancel and an expiry racing for one operation end in exactly one terminal state. Rejected
changes keep the old state and append a history entry with a stable code; the history holds
digests only, never a document.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._core import _clock
from .._core._deadline import Deadline
from .._core._durations import Duration, to_ms, to_seconds
from .._core._errors import TimeboundError
from .._core._renamed import Renamed, renamed
from .._store import Store, Tx, open_store
from .._store._tally import read_off_loop
from ..telemetry._durable import deferred_event
from ..telemetry._events import enabled
from ..telemetry._tracing import caller_traceparent
from ._continuations import (
    ContinuationRefused,
    Continuations,
    RefusalHook,
    Resumer,
    Resumption,
)
from ._contract import (
    STATUS_SCHEMA,
    TERMINAL,
    SchemaError,
    digest,
    format_time,
    parse_time,
    validate_operation,
    validate_status,
)
from ._policy import HostPolicy

__all__ = [
    "CONTINUATION_SCHEMA",
    "ContinuationRefused",
    "Gone",
    "IdempotencyConflict",
    "Operation",
    "StatusOutcome",
    "Registry",
    "Resumption",
    "now_ms",
]

_log = logging.getLogger("timebound.deferred")

#: The one continuation format this version reads (D7.4).
CONTINUATION_SCHEMA = "timebound.continuation.v1"
MAX_CONTINUATION_BYTES = 64 * 1024

_COLUMNS = (
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


def _row_op(row: dict[str, Any]) -> Operation:
    return Operation(**{k: row[k] for k in Operation.__dataclass_fields__})


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _error(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
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
        text = _dump(continuation)
    except (TypeError, ValueError) as exc:  # never pickle: JSON values only
        raise ValueError(f"a continuation is plain JSON: {exc}") from None
    if len(text.encode("utf-8")) > MAX_CONTINUATION_BYTES:
        raise ValueError(f"a continuation is at most {MAX_CONTINUATION_BYTES} bytes of JSON")
    return text


class Registry(Continuations):
    """Deferred operations on a durable store (``sqlite:///FILE`` or ``postgresql://…``).

    ``async with Registry(url) as reg`` opens the store (creating its tables) and closes it.
    ``policy`` clamps every connector hint (:class:`HostPolicy`).
    """

    def __init__(self, store: str | Store, *, policy: HostPolicy | None = None) -> None:
        self._store = open_store(store) if isinstance(store, str) else store
        self._owns_store = isinstance(store, str)
        self.policy = policy if policy is not None else HostPolicy()
        self._resumers: dict[str, Resumer] = {}
        self._on_refused: RefusalHook | None = None
        #: Called when a change may make new work for a poller, with the earliest epoch-ms
        #: instant that work can be due at (``None``: it may be due now).
        self.on_change: Callable[[int | None], None] | None = None

    @property
    def store(self) -> Store:
        return self._store

    async def open(self) -> None:
        await self._store.open()

    async def close(self) -> None:
        if self._owns_store:
            await self._store.close()

    async def __aenter__(self) -> Registry:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _changed(self, at_ms: int | None = None) -> None:
        if self.on_change is not None:
            self.on_change(at_ms)

    # Reads -------------------------------------------------------------------------------

    async def _row(self, tx: Tx, op_id: str, *, lock: bool = False) -> dict[str, Any] | None:
        clause = self._store.lock_clause() if lock else ""
        return await tx.fetchone(f"SELECT * FROM tb_deferred_ops WHERE id = ?{clause}", op_id)

    async def get(self, op_id: str) -> Operation | None:
        """The operation, ``None`` if never issued; :class:`Gone` once its retention ended."""
        async with self._store.transaction() as tx:
            row = await tx.fetchone(f"SELECT {_COLUMNS} FROM tb_deferred_ops WHERE id = ?", op_id)
        if row is None:
            return None
        op = _row_op(row)
        if op.retain_until_ms is not None and now_ms() >= op.retain_until_ms:
            raise Gone(f"deferred operation {op_id!r} is no longer retained")
        return op

    async def operations(
        self,
        *,
        status: str | None = None,
        module: str | None = None,
        after: tuple[int, str] | None = None,
        limit: int = 100,
    ) -> list[Operation]:
        """Operations for an operator view, newest first; ``after`` is the (created_ms, id) of
        the last operation of the previous page."""
        conditions: list[str] = []
        args: list[Any] = []
        if status is not None:
            conditions.append("status = ?")
            args.append(status)
        if module is not None:
            conditions.append("module = ?")
            args.append(module)
        if after is not None:
            conditions.append("(created_ms < ? OR (created_ms = ? AND id > ?))")
            args += [after[0], after[0], after[1]]
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        async with self._store.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM tb_deferred_ops {where} ORDER BY created_ms DESC, id "
                "LIMIT ?",
                *args,
                limit,
            )
        return [_row_op(r) for r in rows]

    async def stats(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """For metrics: operations by (status, module), and polls made (attempts) by module
        (``""`` for operations without a module). Counted off the event loop (D8.12)."""
        (rows,) = await read_off_loop(
            self._store,
            (
                "SELECT status, module, COUNT(*) AS n, SUM(attempts) AS polls "
                "FROM tb_deferred_ops GROUP BY status, module",
            ),
        )
        ops: dict[tuple[str, str], int] = {}
        polls: dict[str, int] = {}
        for r in rows:
            module = r["module"] or ""
            ops[(r["status"], module)] = int(r["n"])
            polls[module] = polls.get(module, 0) + int(r["polls"] or 0)
        return ops, polls

    async def history(self, op_id: str) -> list[dict[str, Any]]:
        """The status history: instant, status, digest and code, never a document."""
        async with self._store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT at_ms, status, digest, code FROM tb_deferred_history WHERE op_id = ? "
                "ORDER BY seq",
                op_id,
            )
        return list(rows)

    async def status_document(self, op_id: str) -> dict[str, Any] | None:
        """The ``deferred-operation-status.v1`` document of an operation this host serves."""
        async with self._store.transaction() as tx:
            row = await self._row(tx, op_id)
        if row is None:
            return None
        op = _row_op(row)
        if op.retain_until_ms is not None and now_ms() >= op.retain_until_ms:
            raise Gone(f"deferred operation {op_id!r} is no longer retained")
        doc: dict[str, Any] = {
            "schema": STATUS_SCHEMA,
            "schema/v": 1,
            "operation/id": op.id,
            "operation/kind": op.kind,
            "status": op.status,
            "expires_at": format_time(op.expires_ms),
            "updated_at": format_time(op.updated_ms),
            "attempt_no": op.attempts,
        }
        if not op.terminal:
            doc["retry_after_seconds"] = op.retry_after_s
        if op.status == "completed":
            doc["result"] = json.loads(row["result"])
        elif op.terminal:
            doc["error"] = json.loads(row["error"])
        return doc

    # Creation ----------------------------------------------------------------------------

    @renamed(
        action_max_ttl_s=Renamed("action_max_ttl"),
        preferred_retry_after_s=Renamed("preferred_retry_after"),
    )
    async def register(
        self,
        doc: dict[str, Any],
        *,
        module: str | None = None,
        idempotency_key: str | None = None,
        request: Any = None,
        continuation: dict[str, Any] | None = None,
        action_max_ttl: Duration | None = None,
        caller_deadline: Deadline | int | None = None,
        preferred_retry_after: Duration | None = None,
    ) -> Operation:
        """Record an accepted ``deferred-operation.v1`` answer; return the stored operation.

        ``module`` names the connector the poller asks for status (``None``: this host serves
        the operation itself). The lifetime is the host policy's (D7.6): the connector's own
        ``expires_at`` is only a hint, clamped by ``action_max_ttl``, the caller's deadline
        and ``max_ttl``. ``preferred_retry_after`` (an action's profile) can only lengthen
        the connector's first interval, which is clamped all the same. With
        ``idempotency_key``, the same key and request give the same operation; the same key
        and another request raise :class:`IdempotencyConflict`.
        """
        validate_operation(doc)
        cont_text = None if continuation is None else check_continuation(continuation)
        at = now_ms()
        fail_after = (parse_time(doc["expires_at"]) - parse_time(doc["created_at"])) / 1000
        life, life_set_by = self.policy.lifetime_bound(
            at,
            fail_after=fail_after,
            action_max_ttl=action_max_ttl,
            caller_deadline=caller_deadline,
        )
        # The schema leaves the hint to the policy: anything but a positive integer is the
        # minimum, recorded as invalid-hint (D7.8).
        retry_after, valid = self.policy.check_retry_after(doc.get("retry_after_seconds"))
        if preferred_retry_after is not None:
            preferred = math.ceil(to_seconds(preferred_retry_after, option="preferred_retry_after"))
            retry_after = self.policy.retry_after(max(retry_after, preferred))
        next_poll = None if module is None else at + self._poll_delay_ms(retry_after, 0)
        idem = None if idempotency_key is None else digest(["idempotency", idempotency_key])
        req = None if idempotency_key is None else digest(request)
        op_id = doc["operation/id"]
        async with self._store.transaction() as tx:
            if idem is not None:
                lock = self._store.lock_clause()
                prior = await tx.fetchone(
                    f"SELECT id, request_digest FROM tb_deferred_ops WHERE idem_digest = ?{lock}",
                    idem,
                )
                if prior is not None:
                    if prior["request_digest"] != req:
                        raise IdempotencyConflict(
                            "this idempotency key was already used for another request"
                        )
                    row = await self._row(tx, prior["id"])
                    assert row is not None
                    return _row_op(row)
            if await self._row(tx, op_id, lock=True) is not None:
                raise ValueError(f"deferred operation {op_id!r} is already registered")
            await tx.execute(
                "INSERT INTO tb_deferred_ops (id, kind, module, status, created_ms, updated_ms, "
                "expires_ms, next_poll_ms, retry_after_s, status_href, cancel_href, "
                "cancel_reason, correlation_id, idem_digest, request_digest, continuation, "
                "continuation_digest, status_digest, traceparent, expires_set_by) "
                "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                op_id,
                doc["operation/kind"],
                module,
                at,
                at,
                at + math.floor(life * 1000),
                next_poll,
                retry_after,
                doc.get("status_href"),
                doc.get("cancel_href"),
                doc.get("cancel/unavailable-reason"),
                doc.get("correlation/id"),
                idem,
                req,
                cont_text,
                None if continuation is None else digest(continuation),
                None,
                caller_traceparent(),
                life_set_by,
            )
            await self._history(
                tx, op_id, at, "pending", digest(doc), None if valid else "invalid-hint"
            )
            row = await self._row(tx, op_id)
        assert row is not None
        # A new operation makes no work before its first poll or its expiry: a poller asleep
        # until earlier need not run a round for it (one per accept at 10,000 pending).
        expires = row["expires_ms"]
        self._changed(expires if next_poll is None else min(next_poll, expires))
        return _row_op(row)

    def _poll_delay_ms(self, retry_after: int, polls: int) -> int:
        # Rounded up: the jittered poll is never earlier than the clamped interval (D7.6).
        return math.ceil(self.policy.poll_delay_s(retry_after, polls) * 1000)

    async def _history(
        self,
        tx: Tx,
        op_id: str,
        at: int,
        status: str,
        doc_digest: str | None,
        code: str | None,
        *,
        lifetime: Mapping[str, Any] | None = None,
    ) -> None:
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
            tx.announce(deferred_event(op_id, at, status, code, lifetime=lifetime))

    # The state machine -------------------------------------------------------------------

    async def apply_status(self, op_id: str, status_doc: object) -> StatusOutcome:
        """Apply a connector's status document under the host's rules (D7.2).

        Never raises for a bad document: a rejection keeps the old state, appends a history
        entry and returns its stable code.
        """
        at = now_ms()
        async with self._store.transaction() as tx:
            row = await self._row(tx, op_id, lock=True)
            if row is None:
                return StatusOutcome(False, "not-found")
            outcome, _ = await self._apply(tx, row, status_doc, at)
        self._changed()
        return outcome

    async def _apply(
        self, tx: Tx, row: dict[str, Any], doc: object, at: int
    ) -> tuple[StatusOutcome, str]:
        """Apply ``doc`` to ``row``; the outcome and the status the row has afterwards."""
        op_id: str = row["id"]
        status: str = row["status"]
        try:
            validate_status(doc)
        except SchemaError:
            await self._history(tx, op_id, at, status, None, "schema")
            return StatusOutcome(False, "schema"), status
        assert isinstance(doc, dict)
        doc_digest = digest(doc)
        if doc["operation/id"] != op_id or doc["operation/kind"] != row["kind"]:
            await self._history(tx, op_id, at, status, doc_digest, "identity-mismatch")
            return StatusOutcome(False, "identity-mismatch"), status
        new: str = doc["status"]
        if status in TERMINAL:
            if doc_digest == row["status_digest"]:
                return StatusOutcome(False, None), status
            await self._history(tx, op_id, at, status, doc_digest, "terminal-conflict")
            return StatusOutcome(False, "terminal-conflict"), status
        updated = parse_time(doc["updated_at"]) if "updated_at" in doc else None
        prior = row["connector_updated_ms"]
        if updated is not None and prior is not None and updated < prior:
            await self._history(tx, op_id, at, status, doc_digest, "stale-status")
            return StatusOutcome(False, "stale-status"), status
        if new == "completed" and at >= row["expires_ms"]:
            # Too late to resume anything: record the result's digest and expire (D7.2).
            await tx.execute(
                "UPDATE tb_deferred_ops SET late_result_digest = ? WHERE id = ?",
                digest(doc["result"]),
                op_id,
            )
            await self._history(tx, op_id, at, status, doc_digest, "late-completion")
            await self._expire(tx, row, at, "expired", "the operation's lifetime ended")
            return StatusOutcome(False, "late-completion"), "expired"
        if status == "running" and new == "pending":
            await self._history(tx, op_id, at, status, doc_digest, "status-regression")
            return StatusOutcome(False, "status-regression"), status
        code: str | None = None
        error = doc.get("error")
        if new == "expired":  # only the host writes expired (D7.2)
            new, code = "failed", "connector-expired"
            error = _error("connector-expired", "the connector reported its operation expired")
        result = doc.get("result") if new == "completed" else None
        terminal = new in TERMINAL
        hint = doc.get("retry_after_seconds", row["retry_after_s"])
        retry_after, valid = self.policy.check_retry_after(hint)
        next_poll = (
            None
            if terminal or row["module"] is None
            else at + self._poll_delay_ms(retry_after, row["attempts"])
        )
        await tx.execute(
            "UPDATE tb_deferred_ops SET status = ?, updated_ms = ?, connector_updated_ms = ?, "
            "next_poll_ms = ?, retry_after_s = ?, error = ?, last_error_code = ?, result = ?, "
            "result_digest = ?, status_digest = ?, retain_until_ms = ?, attempts = ? WHERE id = ?",
            new,
            at,
            updated if updated is not None else row["connector_updated_ms"],
            next_poll,
            retry_after,
            None if error is None else _dump(error),
            None if error is None else error["code"],
            None if result is None else _dump(result),
            None if result is None else digest(result),
            doc_digest,
            at + self.policy.retain * 1000 if terminal else None,
            row["attempts"],
            op_id,
        )
        # A live operation's unusable hint is recorded (D7.8); an ended one is asked nothing more.
        noted = code or (None if valid or terminal else "invalid-hint")
        await self._history(tx, op_id, at, new, doc_digest, noted)
        return StatusOutcome(True, code), new

    async def _expire(self, tx: Tx, row: dict[str, Any], at: int, code: str, message: str) -> None:
        error = _error(code, message)
        await tx.execute(
            "UPDATE tb_deferred_ops SET status = 'expired', updated_ms = ?, next_poll_ms = NULL, "
            "error = ?, last_error_code = ?, status_digest = NULL, retain_until_ms = ? "
            "WHERE id = ?",
            at,
            _dump(error),
            code,
            at + self.policy.retain * 1000,
            row["id"],
        )
        # The bound an expiry reports (D2.8): the row's lifetime and where it was set; a
        # spent poll budget is no deadline.
        lifetime = None if code == "poll-budget-exhausted" else row
        await self._history(tx, row["id"], at, "expired", None, code, lifetime=lifetime)

    async def finish(
        self, op_id: str, status: str, *, result: Any = None, error: dict[str, Any] | None = None
    ) -> StatusOutcome:
        """A host-served operation reaches ``status`` (``running`` or a terminal status).

        The document is built here and applied through the same state machine as a
        connector's; ``expired`` is refused (only the expiry clock writes it).
        """
        doc: dict[str, Any] = {
            "schema": STATUS_SCHEMA,
            "schema/v": 1,
            "operation/id": op_id,
            "operation/kind": op_id.split(":")[1] if op_id.count(":") == 2 else "",
            "status": status,
            "updated_at": format_time(now_ms()),
        }
        if status == "completed":
            doc["result"] = result
        elif status in TERMINAL:
            doc["error"] = error if error is not None else _error(status, status)
        return await self.apply_status(op_id, doc)

    # Host clocks: expiry, poll bookkeeping, cancellation ---------------------------------

    async def expire_due(self, *, startup: bool = False, limit: int = 500) -> int:
        """Write ``expired`` on every live operation whose ``expires_at`` has passed (D7.3).

        At start-up (``startup=True``) the code is ``expired-during-host-downtime``: no final
        poll is made. Returns how many operations expired.
        """
        at = now_ms()
        code = "expired-during-host-downtime" if startup else "expired"
        done = 0
        async with self._store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id, status, created_ms, expires_ms, expires_set_by FROM tb_deferred_ops "
                "WHERE status IN ('pending', 'running') "
                f"AND expires_ms <= ? ORDER BY expires_ms LIMIT ?{self._store.skip_locked()}",
                at,
                limit,
            )
            for row in rows:
                await self._expire(tx, row, at, code, "the operation's lifetime ended")
                done += 1
        if done:
            self._changed()
        return done

    async def next_instant(self, after_ms: int) -> int | None:
        """The earliest instant after ``after_ms`` at which a poll or an expiry is due."""
        async with self._store.transaction() as tx:
            poll = await tx.fetchone(
                "SELECT MIN(next_poll_ms) AS t FROM tb_deferred_ops WHERE next_poll_ms > ?",
                after_ms,
            )
            exp = await tx.fetchone(
                "SELECT MIN(expires_ms) AS t FROM tb_deferred_ops "
                "WHERE status IN ('pending', 'running') AND expires_ms > ?",
                after_ms,
            )
        times = [r["t"] for r in (poll, exp) if r is not None and r["t"] is not None]
        return min(int(t) for t in times) if times else None

    async def live_modules(self) -> list[str]:
        """The modules of the operations still pending or running: the connectors a poller
        needs, whoever registered them (a previous process, another host on the store)."""
        async with self._store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT DISTINCT module FROM tb_deferred_ops "
                "WHERE status IN ('pending', 'running') AND module IS NOT NULL ORDER BY module"
            )
        return [r["module"] for r in rows]

    async def due_polls(self, modules: list[str], limit: int) -> list[Operation]:
        """Live operations of ``modules`` whose next poll is due (never before it, D7.6)."""
        if not modules:
            return []
        marks = ", ".join("?" for _ in modules)
        # Without statistics SQLite's planner prefers the (status, expires_ms) index here, which
        # reads and sorts every live row on every round (2.8 ms at 10,000 pending, the loop's
        # largest cost); walking the next-poll index stops after ``limit`` rows (0.3-0.5 ms).
        # PostgreSQL plans from its own statistics.
        hint = " INDEXED BY tb_deferred_ops_poll" if self._store.dialect == "sqlite" else ""
        async with self._store.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM tb_deferred_ops{hint} WHERE next_poll_ms <= ? "
                f"AND module IN ({marks}) AND status IN ('pending', 'running') "
                "ORDER BY next_poll_ms, id LIMIT ?",
                now_ms(),
                *modules,
                limit,
            )
        return [_row_op(r) for r in rows]

    @renamed(delay_s=Renamed("delay"))
    async def poll_failed(self, op_id: str, delay: Duration, code: str) -> StatusOutcome:
        """A transient poll failure: the status stays, an attempt is spent, the poll backs off.

        Out of attempts (``max_attempts``), the operation expires with
        ``poll-budget-exhausted`` (D7.3).
        """
        delay_ms = to_ms(delay, option="delay")
        at = now_ms()
        async with self._store.transaction() as tx:
            row = await self._row(tx, op_id, lock=True)
            if row is None or row["status"] in TERMINAL:
                return StatusOutcome(False, None)
            attempts = row["attempts"] + 1
            await self._history(tx, op_id, at, row["status"], None, code)
            if self._out_of_attempts(attempts):
                await tx.execute(
                    "UPDATE tb_deferred_ops SET attempts = ? WHERE id = ?", attempts, op_id
                )
                await self._expire(tx, row, at, "poll-budget-exhausted", "no poll attempts left")
                return StatusOutcome(True, "poll-budget-exhausted")
            await tx.execute(
                "UPDATE tb_deferred_ops SET attempts = ?, next_poll_ms = ?, last_error_code = ? "
                "WHERE id = ?",
                attempts,
                at + delay_ms,
                code,
                op_id,
            )
        return StatusOutcome(True, code)

    async def refuse(self, op_id: str, code: str, message: str) -> StatusOutcome:
        """A connector answered something the host refuses outright (an href to another origin,
        D7.12; an answer past the byte cap, D6.21): the operation fails with ``code``, through
        the same state machine as a connector's own ``failed``."""
        at = now_ms()
        async with self._store.transaction() as tx:
            row = await self._row(tx, op_id, lock=True)
            if row is None or row["status"] in TERMINAL:
                return StatusOutcome(False, None)
            doc = {
                "schema": STATUS_SCHEMA,
                "schema/v": 1,
                "operation/id": op_id,
                "operation/kind": row["kind"],
                "status": "failed",
                "updated_at": format_time(at),
                "error": _error(code, message[:500]),
            }
            outcome, _ = await self._apply(tx, row, doc, at)
        self._changed()
        return StatusOutcome(outcome.applied, code)

    def _out_of_attempts(self, attempts: int) -> bool:
        cap = self.policy.max_attempts
        return cap is not None and attempts >= cap

    async def polled(self, op_id: str, status_doc: object, *, resume: bool = True) -> StatusOutcome:
        """Apply the status a poll returned and count the attempt (the poller's path)."""
        return (await self.polled_many([(op_id, status_doc)], resume=resume))[0]

    async def polled_many(
        self, answers: list[tuple[str, object]], *, resume: bool = True
    ) -> list[StatusOutcome]:
        """:meth:`polled` for a round of answers, in one transaction: one commit (and, with
        ``synchronous=FULL``, one fsync) per round instead of one per poll.

        Rows are locked in id order, so two hosts writing overlapping rounds on PostgreSQL
        cannot deadlock. If the transaction fails, nothing of the round is written. With
        ``resume`` an operation that ends resumes its continuation in the same transaction
        (D7.10); without it (the poller's fallback after a failed round) :meth:`resume_due`
        resumes it later.
        """
        at = now_ms()
        order = sorted(range(len(answers)), key=lambda i: answers[i][0])
        outcomes: list[StatusOutcome] = [StatusOutcome(False, None)] * len(answers)
        async with self._store.transaction() as tx:
            for i in order:
                op_id, doc = answers[i]
                outcomes[i] = await self._polled(tx, op_id, doc, at)
                if resume and outcomes[i].applied:
                    await self._resume_in(tx, op_id)
        self._changed()
        return outcomes

    async def _polled(self, tx: Tx, op_id: str, status_doc: object, at: int) -> StatusOutcome:
        row = await self._row(tx, op_id, lock=True)
        if row is None:
            return StatusOutcome(False, "not-found")
        attempts = row["attempts"] + 1
        row = {**row, "attempts": attempts}
        outcome, status = await self._apply(tx, row, status_doc, at)
        if status in TERMINAL or not outcome.applied:
            # An applied live status stored the attempt with it; the rest store it here.
            await tx.execute(
                "UPDATE tb_deferred_ops SET attempts = ? WHERE id = ?", attempts, op_id
            )
        if status not in TERMINAL:
            if self._out_of_attempts(attempts):
                await self._expire(tx, row, at, "poll-budget-exhausted", "no poll attempts left")
                outcome = StatusOutcome(outcome.applied, "poll-budget-exhausted")
            elif not outcome.applied:
                # A rejected answer is not progress: poll again after the clamped interval.
                await tx.execute(
                    "UPDATE tb_deferred_ops SET next_poll_ms = ? WHERE id = ?",
                    at + self._poll_delay_ms(row["retry_after_s"], attempts),
                    op_id,
                )
        return outcome

    async def mark_cancel_requested(self, op_id: str) -> Operation | None:
        """Record that the host asked the connector to cancel (the first request's instant)."""
        async with self._store.transaction() as tx:
            await tx.execute(
                "UPDATE tb_deferred_ops SET cancel_requested_ms = ? "
                "WHERE id = ? AND cancel_requested_ms IS NULL",
                now_ms(),
                op_id,
            )
            row = await self._row(tx, op_id)
        return None if row is None else _row_op(row)
