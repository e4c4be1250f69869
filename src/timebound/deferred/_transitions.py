"""The transitions of deferred operations: registration, the host-enforced state machine
(D7.2), expiry and the poller's bookkeeping (D7.3, D7.6).

Every change is one transaction that locks the row first, so a status, a cancel and an expiry
racing for one operation end in exactly one terminal state. Rejected changes keep the old state
and append a history entry with a stable code; the history holds digests only, never a document.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .._core._deadline import Deadline
from .._core._durations import Duration, to_ms, to_seconds
from .._core._renamed import Renamed, renamed
from .._store import Store, Tx
from ..telemetry._tracing import caller_traceparent
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
from ._rows import (
    IdempotencyConflict,
    Operation,
    StatusOutcome,
    append_history,
    check_continuation,
    dump,
    error_doc,
    fetch_row,
    now_ms,
    row_op,
)

__all__ = ["Transitions"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _public(func: _F) -> _F:
    """Name ``func`` as users call it (``Registry.register``), so that the warnings for its old
    keywords (D1.12) name the public class, not this part of it."""
    func.__qualname__ = f"Registry.{func.__name__}"
    return func


class Transitions:
    """How :class:`~timebound.deferred.Registry` changes its operations (a part of it, which
    provides the store, the policy, ``_changed`` and the continuations' ``_resume_in``)."""

    _store: Store
    policy: HostPolicy
    _changed: Callable[..., None]

    if TYPE_CHECKING:  # provided by Continuations

        async def _resume_in(self, tx: Tx, op_id: str) -> None: ...

    # Creation ----------------------------------------------------------------------------

    @renamed(
        action_max_ttl_s=Renamed("action_max_ttl"),
        preferred_retry_after_s=Renamed("preferred_retry_after"),
    )
    @_public
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
                    row = await fetch_row(tx, self._store, prior["id"])
                    assert row is not None
                    return row_op(row)
            if await fetch_row(tx, self._store, op_id, lock=True) is not None:
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
            await append_history(
                tx, op_id, at, "pending", digest(doc), None if valid else "invalid-hint"
            )
            row = await fetch_row(tx, self._store, op_id)
        assert row is not None
        # A new operation makes no work before its first poll or its expiry: a poller asleep
        # until earlier need not run a round for it (one per accept at 10,000 pending).
        expires = row["expires_ms"]
        self._changed(expires if next_poll is None else min(next_poll, expires))
        return row_op(row)

    def _poll_delay_ms(self, retry_after: int, polls: int) -> int:
        # Rounded up: the jittered poll is never earlier than the clamped interval (D7.6).
        return math.ceil(self.policy.poll_delay_s(retry_after, polls) * 1000)

    # The state machine -------------------------------------------------------------------

    async def apply_status(self, op_id: str, status_doc: object) -> StatusOutcome:
        """Apply a connector's status document under the host's rules (D7.2).

        Never raises for a bad document: a rejection keeps the old state, appends a history
        entry and returns its stable code.
        """
        at = now_ms()
        async with self._store.transaction() as tx:
            row = await fetch_row(tx, self._store, op_id, lock=True)
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
            await append_history(tx, op_id, at, status, None, "schema")
            return StatusOutcome(False, "schema"), status
        assert isinstance(doc, dict)
        doc_digest = digest(doc)
        if doc["operation/id"] != op_id or doc["operation/kind"] != row["kind"]:
            await append_history(tx, op_id, at, status, doc_digest, "identity-mismatch")
            return StatusOutcome(False, "identity-mismatch"), status
        new: str = doc["status"]
        if status in TERMINAL:
            if doc_digest == row["status_digest"]:
                return StatusOutcome(False, None), status
            await append_history(tx, op_id, at, status, doc_digest, "terminal-conflict")
            return StatusOutcome(False, "terminal-conflict"), status
        updated = parse_time(doc["updated_at"]) if "updated_at" in doc else None
        prior = row["connector_updated_ms"]
        if updated is not None and prior is not None and updated < prior:
            await append_history(tx, op_id, at, status, doc_digest, "stale-status")
            return StatusOutcome(False, "stale-status"), status
        if new == "completed" and at >= row["expires_ms"]:
            # Too late to resume anything: record the result's digest and expire (D7.2).
            await tx.execute(
                "UPDATE tb_deferred_ops SET late_result_digest = ? WHERE id = ?",
                digest(doc["result"]),
                op_id,
            )
            await append_history(tx, op_id, at, status, doc_digest, "late-completion")
            await self._expire(tx, row, at, "expired", "the operation's lifetime ended")
            return StatusOutcome(False, "late-completion"), "expired"
        if status == "running" and new == "pending":
            await append_history(tx, op_id, at, status, doc_digest, "status-regression")
            return StatusOutcome(False, "status-regression"), status
        code: str | None = None
        error = doc.get("error")
        if new == "expired":  # only the host writes expired (D7.2)
            new, code = "failed", "connector-expired"
            error = error_doc("connector-expired", "the connector reported its operation expired")
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
            None if error is None else dump(error),
            None if error is None else error["code"],
            None if result is None else dump(result),
            None if result is None else digest(result),
            doc_digest,
            at + self.policy.retain * 1000 if terminal else None,
            row["attempts"],
            op_id,
        )
        # A live operation's unusable hint is recorded (D7.8); an ended one is asked nothing more.
        noted = code or (None if valid or terminal else "invalid-hint")
        await append_history(tx, op_id, at, new, doc_digest, noted)
        return StatusOutcome(True, code), new

    async def _expire(self, tx: Tx, row: dict[str, Any], at: int, code: str, message: str) -> None:
        error = error_doc(code, message)
        await tx.execute(
            "UPDATE tb_deferred_ops SET status = 'expired', updated_ms = ?, next_poll_ms = NULL, "
            "error = ?, last_error_code = ?, status_digest = NULL, retain_until_ms = ? "
            "WHERE id = ?",
            at,
            dump(error),
            code,
            at + self.policy.retain * 1000,
            row["id"],
        )
        # The bound an expiry reports (D2.8): the row's lifetime and where it was set; a
        # spent poll budget is no deadline.
        lifetime = None if code == "poll-budget-exhausted" else row
        await append_history(tx, row["id"], at, "expired", None, code, lifetime=lifetime)

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
            doc["error"] = error if error is not None else error_doc(status, status)
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

    @renamed(delay_s=Renamed("delay"))
    @_public
    async def poll_failed(self, op_id: str, delay: Duration, code: str) -> StatusOutcome:
        """A transient poll failure: the status stays, an attempt is spent, the poll backs off.

        Out of attempts (``max_attempts``), the operation expires with
        ``poll-budget-exhausted`` (D7.3).
        """
        delay_ms = to_ms(delay, option="delay")
        at = now_ms()
        async with self._store.transaction() as tx:
            row = await fetch_row(tx, self._store, op_id, lock=True)
            if row is None or row["status"] in TERMINAL:
                return StatusOutcome(False, None)
            attempts = row["attempts"] + 1
            await append_history(tx, op_id, at, row["status"], None, code)
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
            row = await fetch_row(tx, self._store, op_id, lock=True)
            if row is None or row["status"] in TERMINAL:
                return StatusOutcome(False, None)
            doc = {
                "schema": STATUS_SCHEMA,
                "schema/v": 1,
                "operation/id": op_id,
                "operation/kind": row["kind"],
                "status": "failed",
                "updated_at": format_time(at),
                "error": error_doc(code, message[:500]),
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
        row = await fetch_row(tx, self._store, op_id, lock=True)
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
            row = await fetch_row(tx, self._store, op_id)
        return None if row is None else row_op(row)
