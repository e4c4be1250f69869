"""Token and run states, how a run ended, timer priorities and the JSON encoding of stored
columns."""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from .._json import dumps
from .._store import Tx

__all__ = [
    "LIVE_SQL",
    "PRIORITY_RUN",
    "PRIORITY_TOKEN",
    "RUN_TERMINAL",
    "RunEnd",
    "TERMINAL",
    "RunResult",
    "decode",
    "decode_once",
    "encode",
    "keep_decoded",
    "new_id",
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
    return None if text is None else _decode(text)


_decode = json.JSONDecoder().decode  # json.loads without its per-call checks of bytes input


def encode(value: Any) -> str:
    return dumps(value)  # json.dumps with no options, without its per-call cost


def new_id() -> str:
    """A new run's or token's id: what ``uuid.uuid4().hex`` gives (random, version 4, RFC 4122
    variant), without building a ``UUID`` for each."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    return raw.hex()


_DECODED = "rows.decoded"  # tx.held: (_DECODED, text) -> a value owned by nobody else


def keep_decoded(tx: Tx, text: str, value: Any) -> None:
    """``value`` is what ``text`` decodes to, made fresh and kept by nobody: the next
    :func:`decode_once` of ``text`` in this transaction takes it instead of decoding ``text``
    (a run's state encoded by one outcome is read back by the attempt begun next, D6.36)."""
    tx.held[(_DECODED, text)] = value


def decode_once(tx: Tx, text: str) -> Any:
    """``text`` decoded: the value :func:`keep_decoded` left for it (taken: a second call
    decodes), else decoded now. The caller owns the value."""
    value = tx.held.pop((_DECODED, text), _NOTHING)
    return _decode(text) if value is _NOTHING else value


_NOTHING = object()
