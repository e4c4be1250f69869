"""Continuations of deferred operations: resumed exactly once, from JSON (D7.4), by the
resumer registered for their ``resume_kind`` — in the transaction that stores the operation's
end when the poller stores it (D7.10), else by :meth:`Continuations.resume_due`.

A part of :class:`~timebound.deferred.Registry` (its facade), kept apart so each stays readable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .._core._errors import TimeboundError
from .._store import Store, Tx
from ._contract import TERMINAL, digest
from ._rows import Operation, append_history, check_continuation, fetch_row, now_ms, row_op

__all__ = [
    "ContinuationRefused",
    "Continuations",
    "RefusalHook",
    "Resumer",
    "Resumption",
]

_log = logging.getLogger("timebound.deferred")


class ContinuationRefused(TimeboundError):
    """Raised by a resumer that will not resume a continuation it cannot trust or read.

    ``code`` is recorded as the operation's ``resume_error`` (like ``continuation-tampered``):
    the continuation is refused for good, never retried.
    """

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Resumption:
    """What a resumer receives once an operation with a continuation is terminal."""

    operation: Operation
    continuation: dict[str, Any]
    result: Any
    error: dict[str, Any] | None


Resumer = Callable[[Tx, Resumption], Awaitable[None]]
#: Told, in the transaction that records it, that an operation's continuation was refused.
RefusalHook = Callable[[Tx, Operation, str], Awaitable[None]]


class Continuations:
    """How a registry resumes its operations' continuations (a part of
    :class:`~timebound.deferred.Registry`, which provides the store)."""

    _store: Store
    _resumers: dict[str, Resumer]
    _on_refused: RefusalHook | None

    def on_resume(self, resume_kind: str, resumer: Resumer) -> None:
        """Register how continuations of ``resume_kind`` resume.

        The resumer runs inside the transaction that marks the continuation resumed, so a
        resumer whose effect is in the same store resumes exactly once, also across a crash.
        """
        if resume_kind in self._resumers:
            raise ValueError(f"a resumer for {resume_kind!r} is already registered")
        self._resumers[resume_kind] = resumer

    def on_refused(self, hook: RefusalHook) -> None:
        """Register what happens when a continuation is refused (tampered, unknown version, or
        refused by its resumer): ``hook(tx, operation, code)`` runs in the transaction that
        records the refusal. It is told the operation, never the untrusted continuation."""
        self._on_refused = hook

    async def resume_due(self, limit: int = 100) -> int:
        """Resume every terminal operation whose continuation has not resumed yet."""
        # Found in committed state; each is resumed in a transaction that locks it and reads
        # it again, so one resumed meanwhile (by another host) is skipped there.
        async with self._store.read() as tx:
            rows = await tx.fetch(
                # status first: the (status, expires_ms) index skips the live rows.
                "SELECT id FROM tb_deferred_ops WHERE status IN "
                "('completed', 'failed', 'timed-out', 'cancelled', 'expired', 'unknown') "
                "AND resumed_ms IS NULL AND resume_error IS NULL AND continuation IS NOT NULL "
                "ORDER BY updated_ms, id LIMIT ?",
                limit,
            )
        done = 0
        for r in rows:
            try:
                done += await self._resume_one(r["id"])
            except Exception as exc:  # rolled back: it stays due and is tried again next round
                # The type only: a resumer's message may carry the continuation's content.
                _log.warning("resuming %s failed (%s); will retry", r["id"], type(exc).__name__)
        return done

    async def _resume_one(self, op_id: str) -> int:
        refusal: str | None = None
        try:
            async with self._store.transaction() as tx:
                row = await fetch_row(tx, self._store, op_id, lock=True)
                if row is None or row["resumed_ms"] is not None or row["resume_error"] is not None:
                    return 0
                refusal, resumption = self._resumption(row)
                if resumption is None:
                    raise _Refused
                resumer = self._resumers.get(resumption.continuation["resume_kind"])
                if resumer is None:
                    return 0  # its owner has not started yet: it resumes when it registers
                try:
                    await resumer(tx, resumption)
                except ContinuationRefused as exc:
                    refusal = exc.code
                    raise _Refused from None
                await self._resumed(tx, row)
            return 1
        except _Refused:
            pass
        async with self._store.transaction() as tx:
            await tx.execute(
                "UPDATE tb_deferred_ops SET resume_error = ? WHERE id = ?", refusal, op_id
            )
            await append_history(tx, op_id, now_ms(), "refused", None, refusal)
            if self._on_refused is not None:
                row = await fetch_row(tx, self._store, op_id, lock=True)
                assert row is not None and refusal is not None
                await self._on_refused(tx, row_op(row), refusal)
        return 0

    async def _resume_in(self, tx: Tx, op_id: str) -> None:
        """Resume an operation's continuation in ``tx``, the transaction that stored its end
        (D7.10): the end and its effect commit together, so no restart between them can let a
        timer decide first. A continuation that cannot resume here (refused, no resumer yet) is
        left to :meth:`resume_due`, which records a refusal in a transaction of its own."""
        row = await fetch_row(tx, self._store, op_id, lock=True)
        if row is None or row["continuation"] is None or row["status"] not in TERMINAL:
            return
        if row["resumed_ms"] is not None or row["resume_error"] is not None:
            return
        _, resumption = self._resumption(row)
        if resumption is None:
            return
        resumer = self._resumers.get(resumption.continuation["resume_kind"])
        if resumer is None:
            return
        try:
            await resumer(tx, resumption)
        except ContinuationRefused:
            return  # a resumer refuses before it writes: resume_due records it
        await self._resumed(tx, row)

    async def _resumed(self, tx: Tx, row: dict[str, Any]) -> None:
        at = now_ms()
        await tx.execute("UPDATE tb_deferred_ops SET resumed_ms = ? WHERE id = ?", at, row["id"])
        await append_history(tx, row["id"], at, row["status"], None, "resumed")

    def _resumption(self, row: dict[str, Any]) -> tuple[str | None, Resumption | None]:
        try:
            continuation = json.loads(row["continuation"])
        except ValueError:
            return "continuation-tampered", None
        if digest(continuation) != row["continuation_digest"]:
            return "continuation-tampered", None
        try:
            check_continuation(continuation)
        except ValueError:
            return "continuation-version", None
        op = row_op(row)
        result = json.loads(row["result"]) if row["status"] == "completed" else None
        error = json.loads(row["error"]) if row["error"] is not None else None
        return None, Resumption(op, continuation, result, error)


class _Refused(Exception):
    """A continuation that must not resume (tampered, or of an unknown version)."""
