"""One run's failure stays that run's: a turn that raises for one run fails that run (D6.22).

The engine's turn is one transaction for every run it touches (group commit). Before D6.22 an
exception raised while handling one run (a value that broke a walker, a bug met by one run's
data) rolled the whole turn back, and the turn was retried forever with the same run in it:
nothing else committed, on PostgreSQL on every worker. Now the work of each run inside a turn
is *attributed*: an exception raised there becomes a :class:`RunFault` naming the run, the
turn is rolled back as before, that run alone is failed with code ``engine-error`` in a
transaction of its own (:func:`quarantine`), and the turn runs again without it.

A failure of the store itself (a dropped connection, a deadlock, a locked SQLite file) is not
the run's fault: it keeps the old behaviour (the turn is retried after a pause), so an outage
never fails runs. Only errors raised by our own code on one run's data are attributed.
"""

from __future__ import annotations

import logging
from typing import Any

from .._store import StoreError, Tx
from ._rows import LIVE_SQL

__all__ = ["ENGINE_ERROR", "RunFault", "attribute", "isolate", "store_fault"]

#: The stable code a run failed by the engine's isolation carries (first in its error text).
ENGINE_ERROR = "engine-error"
# Exceptions of these packages come from the store's driver: never a run's fault.
_DRIVERS = frozenset({"sqlite3", "_sqlite3", "asyncpg", "psycopg", "psycopg2", "aiosqlite"})

_log = logging.getLogger("timebound.workflow")


class RunFault(Exception):
    """The turn failed while handling one run (``run_id``), or one start (``start``)."""

    def __init__(self, cause: BaseException, run_id: str | None, start: Any = None) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.run_id = run_id
        self.start = start


def store_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing (an outage, a conflict), not a run's data."""
    if isinstance(exc, (OSError, TimeoutError, StoreError)):
        return True
    return any(cls.__module__.split(".")[0] in _DRIVERS for cls in type(exc).__mro__)


def attribute(exc: Exception, run_id: str | None, start: Any = None) -> Exception:
    """What to raise for ``exc`` met while handling ``run_id``: a :class:`RunFault` unless it
    is already one or the store's own failure."""
    if isinstance(exc, RunFault) or store_fault(exc):
        return exc
    return RunFault(exc, run_id, start)


def error_text(fault: RunFault) -> str:
    # Stored in a TEXT column: no NUL (PostgreSQL refuses it), bounded length.
    return f"{ENGINE_ERROR}: {fault}".replace("\x00", "\\0")[:1000]


async def quarantine(tx: Tx, machine: Any, fault: RunFault, now: int, lock: str) -> None:
    """Fail the run of ``fault`` (code ``engine-error``) in ``tx``: through the state machine
    (its tokens cancelled, its parent told), or, if the machine raises on this run too, by
    writing the end directly."""
    assert fault.run_id is not None
    error = error_text(fault)
    _log.error("workflow run %s failed by the engine: %s", fault.run_id, error)
    run = await machine.run(tx, fault.run_id, lock=lock)
    if run is not None:
        await machine.fail_run(tx, run, error, now)


async def quarantine_raw(tx: Tx, fault: RunFault, now: int) -> None:
    """The last resort of :func:`quarantine`: end the run and its tokens with plain writes."""
    assert fault.run_id is not None
    error = error_text(fault)
    await tx.execute(
        "UPDATE tb_wf_runs SET status = 'failed', finished_at = ?, error = ? "
        "WHERE id = ? AND status = 'running'",
        now,
        error,
        fault.run_id,
    )
    await tx.execute(
        f"UPDATE tb_wf_tokens SET status = 'cancelled', updated_at = ? "
        f"WHERE run_id = ? AND status IN {LIVE_SQL}",
        now,
        fault.run_id,
    )
    await tx.clear_stream_timers(fault.run_id)
    await tx.append_event(
        fault.run_id, "run_failed", now, workflow_run_id=fault.run_id, error=error
    )
    tx.wake_others = True


async def isolate(engine: Any, fault: RunFault) -> None:
    """Fail the run (or refuse the start) ``engine``'s turn raised for, in a transaction of its
    own (the engine's ``_txn``, ``_machine``, ``_now``, ``_store`` and ``_run_finished``)."""
    if fault.run_id is None:
        if fault.start is not None:
            fault.start.settle(error=fault.cause)
        return
    lock = engine._store.lock_clause()
    try:
        async with engine._txn() as tx:
            await quarantine(tx, engine._machine, fault, engine._now(), lock)
    except Exception as exc:
        if store_fault(exc):
            return  # the store is failing: the next turn meets it and pauses
        async with engine._txn() as tx:  # the machine raised on this run again
            await quarantine_raw(tx, fault, engine._now())
    engine._run_finished(fault.run_id)
