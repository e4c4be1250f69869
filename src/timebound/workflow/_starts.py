"""What :meth:`Engine.start` is asked: the run's deadline (D6.17, D6.11), its idempotency key or
client-chosen id, and what a repeat of the same start must match (D6.18).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import warnings
from datetime import timedelta
from typing import Any

from .._core._deadline import Deadline
from .._core._durations import to_seconds
from .._core._errors import ConfigurationError, TimeboundError
from .._core._scopes import current_deadline

__all__ = [
    "StartConflict",
    "StartInterrupted",
    "check_run_id",
    "request_digest",
    "start_deadline",
    "started_run_id",
]

#: A client-chosen run id or idempotency key: printable ASCII without spaces, at most 200 chars.
_KEY_RE = re.compile(r"[!-~]{1,200}")


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
    deadline_ms: int | None,
) -> int | None:
    """The caller's bound on a run, in epoch ms (D6.17): ``deadline`` (a :class:`Deadline`, or a
    duration from now), the caller's current deadline with ``inherit_deadline`` (D6.11), and the
    deprecated ``deadline_ms``; the earliest of those present, ``None`` without any."""
    bounds: list[int] = []
    if deadline_ms is not None:
        warnings.warn(
            "Engine.start(deadline_ms=…) is deprecated; pass deadline= (a Deadline, or a "
            "duration such as '250ms', seconds or a timedelta)",
            DeprecationWarning,
            stacklevel=3,
        )
        if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int) or deadline_ms < 1:
            raise ConfigurationError("deadline_ms must be >= 1", option="deadline_ms")
        bounds.append(now_ms + deadline_ms)
    if isinstance(deadline, Deadline):
        if not deadline.is_never:
            at = deadline.to_epoch_ms()
            assert at is not None
            bounds.append(at)
    elif deadline is not None:
        seconds = to_seconds(deadline, option="deadline", allow_zero=False)
        if not math.isinf(seconds):
            # Whole milliseconds rounded up: never earlier than asked (D1.3).
            bounds.append(now_ms + math.ceil(round(seconds * 1000, 6)))
    if inherit_deadline:
        at = current_deadline().to_epoch_ms()
        if at is not None:
            bounds.append(at)
    return min(bounds) if bounds else None
