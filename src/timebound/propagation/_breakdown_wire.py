"""A service's own breakdown on the wire (DECISIONS D13.5, D13.6): diagnostic only.

A timebound server that answers "deadline expired" (498, gRPC ``DEADLINE_EXCEEDED``), or any
response when the caller asked with ``X-Timebound-Breakdown: 1``, attaches the breakdown of its
own side as compact JSON in the ``X-Timebound-Breakdown`` response header (trailing metadata
``x-timebound-breakdown`` over gRPC), capped in size. It does so only when its middleware or
interceptor was built with ``expose_breakdown=True``: a breakdown tells a caller what a service
calls and how long that takes, which an untrusted caller should not learn by default.

A timebound client reads the header whenever it is present and folds it into the call's part of
its own tree. It is never used to decide anything (no retry, no deadline, no status depends on
it); it is parsed strictly, and a malformed or oversized one is ignored with a warning at most
once a minute per process.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from typing import Any, Final

from .._core import _clock
from .._core._breakdown import Breakdown
from .._core._errors import ConfigurationError
from .._core._scopes import _Frame, frame_breakdown

__all__ = [
    "BREAKDOWN_HEADER",
    "MAX_HEADER_BYTES",
    "asked",
    "check_max_bytes",
    "encode",
    "parse",
]

#: Request header asking for the callee's breakdown (value ``1``), and the response header or
#: trailing metadata key carrying it.
BREAKDOWN_HEADER: Final = "X-Timebound-Breakdown"
#: The most a server sends, and the most a client reads.
MAX_HEADER_BYTES: Final = 2048

logger = logging.getLogger("timebound.propagation")
_WARN_EVERY: Final = 60.0


class _Warnings:
    """One warning line per interval for malformed breakdowns, with how many were quiet."""

    __slots__ = ("lock", "next_at", "quiet")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_at = -math.inf
        self.quiet = 0

    def warn(self, problem: str) -> None:
        with self.lock:
            t = _clock.now()
            if t < self.next_at:
                self.quiet += 1
                return
            self.next_at = t + _WARN_EVERY
            quiet, self.quiet = self.quiet, 0
        logger.warning(
            "ignored a malformed %s from a callee: %s%s",
            BREAKDOWN_HEADER,
            problem[:200],
            f" ({quiet} more ignored since the last such line)" if quiet else "",
        )


# Process-wide on purpose: a rate limit on one log line, no state anybody reads back.
_warnings = _Warnings()


def parse(value: str | bytes | None) -> Breakdown | None:
    """The callee's breakdown from a header value; ``None`` when absent or malformed (warned)."""
    if value is None:
        return None
    try:
        if len(value) > MAX_HEADER_BYTES:
            raise ValueError(f"{len(value)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
        if isinstance(value, bytes):
            value = value.decode("ascii")
        if not isinstance(value, str):
            raise ValueError(f"not text: {type(value).__name__}")
        return Breakdown.from_json(value, max_bytes=MAX_HEADER_BYTES)
    except (ValueError, UnicodeDecodeError) as exc:
        _warnings.warn(str(exc))
        return None


def encode(bd: Breakdown, max_bytes: int = MAX_HEADER_BYTES) -> str | None:
    """The header value for ``bd``, summarised to fit ``max_bytes`` (``None``: nothing fits)."""
    return bd.capped(max_bytes)


def check_max_bytes(value: Any) -> int:
    """The ``breakdown_max_bytes`` option: an int from 64 to 8192."""
    if type(value) is not int or not 64 <= value <= 8192:
        raise ConfigurationError(
            f"breakdown_max_bytes must be an int from 64 to 8192, not {value!r}",
            option="breakdown_max_bytes",
        )
    return value


def asked(headers: Iterable[tuple[Any, Any]]) -> bool:
    """The request asked for the breakdown (``X-Timebound-Breakdown: 1``)."""
    want = BREAKDOWN_HEADER.lower()
    for k, v in headers:
        key = k.decode("latin-1") if isinstance(k, bytes) else str(k)
        if key.lower() == want:
            value = v.decode("latin-1") if isinstance(v, bytes) else str(v)
            return value.strip() == "1"
    return False


def server_value(bound: _Frame, outcome: str, max_bytes: int = MAX_HEADER_BYTES) -> str | None:
    """The header value describing a request's bound from its arrival to now."""
    bd = frame_breakdown(bound, _clock.now(), None, outcome=outcome)
    return encode(bd, max_bytes)
