"""Token and run states, how a run ended, timer priorities and the JSON encoding of stored
columns."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .._json import dumps

__all__ = [
    "LIVE_SQL",
    "PRIORITY_RUN",
    "PRIORITY_TOKEN",
    "RUN_TERMINAL",
    "RunEnd",
    "TERMINAL",
    "RunResult",
    "decode",
    "encode",
]

TERMINAL = ("completed", "failed", "timed_out", "cancelled")
RUN_TERMINAL = ("completed", "failed", "timed_out", "cancelled")
LIVE_SQL = "('pending', 'dispatched', 'executing', 'waiting_for_siblings')"


class RunResult(NamedTuple):
    """How a run ended: ``status`` (completed | failed | timed_out | cancelled), ``output`` (the
    context's ``state`` when completed) and ``error``."""

    status: str
    output: Any
    error: str | None


class RunEnd(NamedTuple):
    """How a run ended, as the transaction that ended it holds it: its ``state`` still encoded
    (decoded only for a waiter)."""

    status: str
    state: str
    error: str | None

    def result(self) -> RunResult:
        output = decode(self.state) if self.status == "completed" else None
        return RunResult(self.status, output, self.error)


# Timer priorities at one instant: the workflow timeout is handled first (D6.4).
PRIORITY_RUN, PRIORITY_TOKEN = 0, 1


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def encode(value: Any) -> str:
    return dumps(value)  # json.dumps with no options, without its per-call cost
