"""Wire codecs for deadline propagation headers (DECISIONS D4.1, D4.3).

Parsing never raises: a header that cannot be read means *no deadline* and a rate-limited
warning, exactly like userver, because a malformed header from a caller must not turn into a 500.

Formats
-------
``X-YaTaxi-Client-TimeoutMs`` (userver)
    Decimal milliseconds, ASCII digits only, an optional leading ``+``. ``0`` and ``-0`` mean the
    caller's deadline is already spent. Empty, spaces inside, units, fractions, other signs,
    non-ASCII digits and values that overflow a signed 64-bit integer are invalid.
``grpc-timeout`` (gRPC over HTTP/2)
    1 to 8 ASCII digits and one unit: ``H`` hours, ``M`` minutes, ``S`` seconds, ``m`` ms,
    ``u`` µs, ``n`` ns. ``0<unit>`` means already expired.
``X-Request-Deadline`` (newer userver, D9.3)
    The absolute deadline in whole microseconds of the Unix epoch (system clock), ASCII digits
    only. It counts the time in transit, which the relative header cannot; the server takes it
    only where it agrees with the relative one within the configured clock skew.
``x-envoy-expected-rq-timeout-ms`` (Envoy)
    Decimal milliseconds like userver's header, but ``0`` means *infinite* in Envoy, so it gives
    no deadline here.

All three: a value of 10 years or more is ignored (no deadline, no warning). Leading and trailing
spaces/tabs are stripped first: RFC 9110 §5.5 says they are not part of a field value, and most
servers strip them already, so the result does not depend on the server. The effective received
timeout is the minimum of every valid header present.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from .._core import _clock
from .._core._durations import ceil_ms

__all__ = [
    "ABSOLUTE_HEADER",
    "ENVOY_TIMEOUT_HEADER",
    "EXPIRED_BODY",
    "EXPIRED_HEADER",
    "GRPC_TIMEOUT_HEADER",
    "TIMEOUT_HEADER",
    "HeaderNames",
    "ReceivedTimeout",
    "ceil_ms",
    "format_absolute_us",
    "format_grpc_timeout",
    "format_timeout_ms",
    "parse_absolute_us",
    "parse_envoy_timeout",
    "parse_grpc_timeout",
    "parse_timeout_ms",
    "read_absolute",
    "read_timeout",
]

logger = logging.getLogger("timebound.propagation")

TIMEOUT_HEADER: Final = "X-YaTaxi-Client-TimeoutMs"
EXPIRED_HEADER: Final = "X-YaTaxi-Deadline-Expired"
GRPC_TIMEOUT_HEADER: Final = "grpc-timeout"
ENVOY_TIMEOUT_HEADER: Final = "x-envoy-expected-rq-timeout-ms"
ABSOLUTE_HEADER: Final = "X-Request-Deadline"
EXPIRED_BODY: Final = b"Deadline expired"

#: Values at or above this are not deadlines (D4.1): "10 years" is userver's cut-off.
MAX_TIMEOUT_SECONDS: Final = 10 * 365 * 24 * 3600.0
_INT64_MAX: Final = 2**63 - 1
_OWS: Final = " \t"

# fullmatch + ASCII classes: ``\d`` and ``int()`` accept Unicode digits ("٣"), ``$`` accepts a
# trailing newline; neither is a valid wire value.
_MS_RE: Final = re.compile(r"(\+?)([0-9]+)|-(0+)", re.ASCII)
_US_RE: Final = re.compile(r"[0-9]{1,19}", re.ASCII)
_GRPC_RE: Final = re.compile(r"([0-9]{1,8})([HMSmun])", re.ASCII)
_GRPC_UNITS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}

# One warning per header name per interval, so a misbehaving caller cannot flood the logs.
_WARN_INTERVAL: Final = 60.0
_last_warning: dict[str, float] = {}


def _warn_invalid(header: str, value: str) -> None:
    now = _clock.now()
    last = _last_warning.get(header)
    if last is not None and now - last < _WARN_INTERVAL:
        return
    _last_warning[header] = now
    shown = value if len(value) <= 64 else value[:64] + "…"
    logger.warning("ignoring invalid %s header %r: treated as no deadline", header, shown)


def _text(value: str | bytes) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    return value.strip(_OWS)


class _Invalid:
    """Marker for a value that could not be parsed (distinct from "no deadline")."""


INVALID: Final = _Invalid()


def _parse_ms(text: str) -> float | _Invalid | None:
    m = _MS_RE.fullmatch(text)
    if m is None:
        return INVALID
    if m.group(3) is not None:  # "-0", "-00": zero with a sign is still zero
        return 0.0
    digits = m.group(2)
    # Check the length before int(): a million-digit header must not cost a bignum conversion.
    if len(digits.lstrip("0")) > 19:
        return INVALID
    ms = int(digits)
    if ms > _INT64_MAX:
        return INVALID
    seconds = ms / 1000.0
    if seconds >= MAX_TIMEOUT_SECONDS:
        return None
    return seconds


def _parse_us(text: str) -> float | _Invalid | None:
    """Epoch microseconds as epoch seconds (an absolute instant, not a duration)."""
    if _US_RE.fullmatch(text) is None:
        return INVALID
    return int(text) / 1e6


def _parse_envoy(text: str) -> float | _Invalid | None:
    result = _parse_ms(text)
    return None if result == 0.0 else result  # 0 is infinite in Envoy


def _parse_grpc(text: str) -> float | _Invalid | None:
    m = _GRPC_RE.fullmatch(text)
    if m is None:
        return INVALID
    seconds = int(m.group(1)) * _GRPC_UNITS[m.group(2)]
    return None if seconds >= MAX_TIMEOUT_SECONDS else seconds


_Member = Callable[[str], "float | _Invalid | None"]


def _read(values: Iterable[str | bytes], member: _Member, header: str) -> float | None:
    """The one reading of a header: every value it arrived with, as a list of members.

    A header repeated on several lines means the same as its values joined by commas (RFC 9110
    5.3), and servers differ in which form they hand over (WSGI joins, ASGI does not), so both
    are read as one list of members: the header's timeout is their minimum (D4.1) and a single
    malformed member (an empty one included) makes the whole header invalid — no deadline from
    it and a rate-limited warning — whichever form it came in.
    """
    best: float | None = None
    shown: list[str] = []
    invalid = False
    for value in values:
        shown.append(_printable(value))
        text = _text(value)
        if text is None:
            invalid = True
            continue
        for part in text.split(","):
            result = member(part.strip(_OWS))
            if isinstance(result, _Invalid):
                invalid = True
            elif result is not None and (best is None or result < best):
                best = result
    if invalid:
        _warn_invalid(header, ", ".join(shown))
        return None
    return best


def parse_timeout_ms(value: str | bytes, *, header: str = TIMEOUT_HEADER) -> float | None:
    """Seconds carried by an ``X-YaTaxi-Client-TimeoutMs`` value; ``None`` for no deadline.

    ``0.0`` means already expired. A comma-joined value gives its minimum. Invalid values give
    ``None`` and a rate-limited warning.
    """
    return _read((value,), _parse_ms, header)


def parse_envoy_timeout(value: str | bytes, *, header: str = ENVOY_TIMEOUT_HEADER) -> float | None:
    """Seconds carried by ``x-envoy-expected-rq-timeout-ms``; ``0`` is infinite in Envoy."""
    return _read((value,), _parse_envoy, header)


def parse_grpc_timeout(value: str | bytes, *, header: str = GRPC_TIMEOUT_HEADER) -> float | None:
    """Seconds carried by a ``grpc-timeout`` value (``100m``, ``5S``); ``None`` for no deadline."""
    return _read((value,), _parse_grpc, header)


def parse_absolute_us(value: str | bytes, *, header: str = ABSOLUTE_HEADER) -> float | None:
    """Epoch seconds carried by an ``X-Request-Deadline`` value (whole microseconds); ``None``
    when invalid (with a rate-limited warning). A comma-joined value gives its minimum."""
    return _read((value,), _parse_us, header)


def format_absolute_us(epoch_seconds: float) -> str:
    """The ``X-Request-Deadline`` value for an instant: whole microseconds, rounded up, so the
    callee never sees an earlier deadline than ours (as D4.3 rounds the relative header)."""
    return str(max(0, math.ceil(round(epoch_seconds * 1e6, 3))))


def _printable(value: str | bytes) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def format_timeout_ms(seconds: float) -> str:
    """The ``X-YaTaxi-Client-TimeoutMs`` value for ``seconds``: whole ms, rounded up, never 0."""
    return str(max(1, ceil_ms(seconds)))


def format_grpc_timeout(seconds: float) -> str:
    """The ``grpc-timeout`` value for ``seconds``: at most 8 digits, rounded up, never 0."""
    for unit, scale in (("n", 1e-9), ("u", 1e-6), ("m", 1e-3), ("S", 1.0), ("M", 60.0)):
        count = max(1, math.ceil(round(seconds / scale, 6)))
        if count < 100_000_000:
            return f"{count}{unit}"
    return f"{min(99_999_999, max(1, math.ceil(seconds / 3600.0)))}H"


@dataclass(frozen=True, slots=True)
class HeaderNames:
    """Which request/response headers carry deadlines. ``None`` disables reading that header."""

    timeout: str = TIMEOUT_HEADER
    expired: str = EXPIRED_HEADER
    grpc_timeout: str | None = GRPC_TIMEOUT_HEADER
    envoy_timeout: str | None = ENVOY_TIMEOUT_HEADER
    absolute: str | None = ABSOLUTE_HEADER


@dataclass(frozen=True, slots=True)
class ReceivedTimeout:
    """The timeout a request arrived with: ``seconds`` (0.0 = already expired) and its wire ms."""

    seconds: float

    @property
    def ms(self) -> int:
        """Whole milliseconds, rounded up (the ``deadline_received_ms`` span tag)."""
        return ceil_ms(self.seconds)


def read_timeout(
    headers: Iterable[tuple[str, str | bytes]], names: HeaderNames = HeaderNames()
) -> ReceivedTimeout | None:
    """The minimum timeout over every deadline header in ``headers`` (lower-case names).

    ``headers`` holds (lower-cased name, value) pairs, a repeated header once per line, or one
    comma-joined line: either way its values are one list (see :func:`_read`). Never raises.
    """
    readers: dict[str, tuple[_Member, str]] = {names.timeout.lower(): (_parse_ms, names.timeout)}
    if names.grpc_timeout:
        readers[names.grpc_timeout.lower()] = (_parse_grpc, names.grpc_timeout.lower())
    if names.envoy_timeout:
        readers[names.envoy_timeout.lower()] = (_parse_envoy, names.envoy_timeout.lower())
    values: dict[str, list[str | bytes]] = {}
    for name, value in headers:
        if name in readers:
            values.setdefault(name, []).append(value)
    best: float | None = None
    for name, lines in values.items():
        member, header = readers[name]
        seconds = _read(lines, member, header)
        if seconds is not None and (best is None or seconds < best):
            best = seconds
    return None if best is None else ReceivedTimeout(best)


def read_absolute(
    headers: Iterable[tuple[str, str | bytes]], names: HeaderNames = HeaderNames()
) -> float | None:
    """The absolute deadline (epoch seconds) in ``headers`` (lower-case names), or ``None``."""
    if not names.absolute:
        return None
    name = names.absolute.lower()
    lines = [value for key, value in headers if key == name]
    return _read(lines, _parse_us, names.absolute) if lines else None
