"""What :meth:`Engine.start` is asked: the run's deadline (D6.17, D6.11), its idempotency key or
client-chosen id, and what a repeat of the same start must match (D6.18).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from .._core._deadline import Deadline
from .._core._durations import to_ms, to_seconds
from .._core._errors import ConfigurationError, TimeboundError
from .._core._scopes import current_deadline
from .._store import Tx
from ._definition import Definition

if TYPE_CHECKING:
    from ._machine import Machine

__all__ = [
    "Start",
    "await_start",
    "StartConflict",
    "StartInterrupted",
    "check_run_id",
    "keyed_run",
    "request_digest",
    "settle_from",
    "start_keyed",
    "start_deadline",
    "started_run_id",
]

#: A client-chosen run id or idempotency key: printable ASCII without spaces, at most 200 chars.
_KEY_RE = re.compile(r"[!-~]{1,200}")


class Start(NamedTuple):
    """A run to start, waiting for the loop's next transaction."""

    definition: Definition
    input: Any
    future: asyncio.Future[str]
    deadline_at: int | None
    run_id: str
    idempotency_key: str | None = None
    digest: str | None = None
    #: Resolved like ``future`` but never cancelled with its caller: how an interrupted start
    #: learns whether its run was stored (D6.18).
    settled: asyncio.Future[str] | None = None
    traceparent: str | None = None  # the caller's span, parent of the run's (D10.5)

    def settle(self, run_id: str | None = None, error: BaseException | None = None) -> None:
        for f in (self.future, self.settled):
            if f is not None and not f.done():
                if error is not None:
                    f.set_exception(error)
                else:
                    f.set_result(run_id)  # type: ignore[arg-type]


def settle_from(task: asyncio.Future[str], start: Start) -> None:
    """Settle a start from the task that ran it alone."""
    if task.cancelled():
        start.settle(error=RuntimeError("the start was cancelled"))
    elif task.exception() is not None:
        start.settle(error=task.exception())
    else:
        start.settle(task.result())


async def await_start(
    start: Start, awaited: asyncio.Future[str], queue: Callable[[], list[Start]]
) -> str:
    """Wait for a start; if cancelled meanwhile, tell the caller what was stored (D6.18).

    Still in ``queue()`` (the starts no transaction has taken yet, read at the cancellation:
    the loop swaps the list for a fresh one when it takes them): withdrawn, nothing is stored,
    and the cancellation propagates. Taken: the transaction is under way, so wait for it (one
    commit) and propagate the cancellation as a :class:`StartInterrupted` carrying the stored
    run's id, or unchanged if nothing was stored. A cancellation is never swallowed.
    """
    try:
        return await awaited
    except asyncio.CancelledError as cancelled:
        waiting = queue()
        if any(s is start for s in waiting):
            waiting.remove(start)
            raise
        settled = start.settled
        assert settled is not None
        while not settled.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([settled])
        if settled.cancelled() or settled.exception() is not None:
            raise
        raise StartInterrupted(settled.result()) from cancelled


class StartConflict(TimeboundError, ValueError):
    """A start named an idempotency key (or run id) that a different request already used:
    another definition, version or input. ``run_id`` is the run that holds the key."""

    code = "workflow-start-conflict"

    def __init__(self, message: str, *, run_id: str, path: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.path = path


class StartInterrupted(asyncio.CancelledError):
    """A cancellation (a deadline, D6.18) that reached :meth:`Engine.start` while its run was
    being committed: the run *is* stored, as ``run_id``. It is a ``CancelledError``, so scopes
    turn it into their ``DeadlineExceeded`` as usual; that error's ``__cause__`` is this one
    (:func:`started_run_id` reads it)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"cancelled while run {run_id} was being stored; the run is stored")
        self.run_id = run_id


def started_run_id(exc: BaseException) -> str | None:
    """The id of the run an interrupted :meth:`Engine.start` stored, from the error it raised
    (a ``DeadlineExceeded`` or a ``CancelledError``); ``None`` when nothing was stored."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, StartInterrupted):
            return cur.run_id
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def check_run_id(value: str | None, option: str) -> str | None:
    """A client-chosen run id or idempotency key, validated (``ConfigurationError`` naming it)."""
    if value is None:
        return None
    if not isinstance(value, str) or _KEY_RE.fullmatch(value) is None:
        raise ConfigurationError(
            f"{option} must be 1 to 200 printable ASCII characters without spaces, "
            f"got {value!r:.80}",
            option=option,
        )
    return value


def request_digest(definition_id: str, version: int, input: Any) -> str:
    """What a repeated start must match to return the same run (D6.18): the definition, its
    version and the input. The deadline is not part of it: a retry's relative deadline differs."""
    body = json.dumps([definition_id, version, input], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def start_deadline(
    now_ms: int,
    deadline: Deadline | float | int | timedelta | str | None,
    inherit_deadline: bool,
) -> int | None:
    """The caller's bound on a run, in epoch ms (D6.17): ``deadline`` (a :class:`Deadline`, or a
    duration from now) and the caller's current deadline with ``inherit_deadline`` (D6.11); the
    earliest of those present, ``None`` without any."""
    bounds: list[int] = []
    if isinstance(deadline, Deadline):
        if not deadline.is_never:
            at = deadline.to_epoch_ms()
            assert at is not None
            bounds.append(at)
    elif deadline is not None:
        seconds = to_seconds(deadline, option="deadline", allow_zero=False)
        if not math.isinf(seconds):
            # Whole milliseconds rounded up: never earlier than asked (D1.3).
            bounds.append(now_ms + to_ms(seconds, option="deadline"))
    if inherit_deadline:
        at = current_deadline().to_epoch_ms()
        if at is not None:
            bounds.append(at)
    return min(bounds) if bounds else None


async def keyed_run(tx: Tx, key: str | None, run_id: str | None, digest: str) -> str | None:
    """The run an earlier start with this idempotency key (else this run id) stored, if any
    (D6.18); :class:`StartConflict` if that start asked for something else."""
    where, arg, path = (
        ("idempotency_key = ?", key, "idempotency_key")
        if key is not None
        else ("id = ?", run_id, "run_id")
    )
    row = await tx.fetchone(f"SELECT id, request_digest FROM tb_wf_runs WHERE {where}", arg)
    if row is None:
        return None
    if row["request_digest"] != digest:
        raise StartConflict(
            f"{path} {arg!r} already started run {row['id']} with another definition, "
            "version or input",
            run_id=row["id"],
            path=path,
        )
    return row["id"]  # type: ignore[no-any-return]


async def start_keyed(machine: Machine, tx: Tx, start: Start, now: int) -> str:
    """A start asked of the engine: the run an earlier start with the same key or id stored
    (D6.18), else a new one under the caller's deadline (D6.17)."""
    digest = start.digest
    if digest is not None:
        found = None
        if start.idempotency_key is not None:
            found = await keyed_run(tx, start.idempotency_key, None, digest)
        if found is None:
            found = await keyed_run(tx, None, start.run_id, digest)
        if found is not None:
            return found
    definition = start.definition
    return await machine.start_run(
        tx,
        definition,
        start.input,
        now,
        timeout_ms=definition.timeout_ms,
        inherited_deadline_at=start.deadline_at,
        run_id=start.run_id,
        idempotency_key=start.idempotency_key,
        request_digest=digest,
        traceparent=start.traceparent,
    )
