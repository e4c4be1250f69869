"""Durations: seconds, ``timedelta`` and Constellation duration strings (DECISIONS D1.2)."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from ._errors import ConfigurationError

__all__ = ["Duration", "ceil_ms", "format_duration", "parse_duration", "to_ms", "to_seconds"]

#: What the Python API accepts wherever it takes a duration.
Duration = float | int | timedelta | str

# Integer, no space, no fraction; units as the Constellation language spells them.
_UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
# ASCII digits only: ``\d`` would take Arabic-Indic or full-width digits (int() reads them),
# which the grammar and the header codec reject; one duration must mean the same everywhere.
_DURATION_RE = re.compile(r"([0-9]+)(ms|s|min|h|d)")
# No float reaches 10**309 seconds: a longer number is too large, whatever its unit.
_MAX_DIGITS = 310


def parse_duration(text: str, *, option: str = "duration") -> float:
    """Parse ``250ms``, ``5s``, ``2min``, ``1h``, ``1d`` into seconds.

    Raises :class:`ConfigurationError` naming ``option`` for anything else.
    """
    m = _DURATION_RE.fullmatch(text)
    if m is None and not text.isascii():
        foreign = ", ".join(sorted({repr(c) for c in text if not c.isascii()}))
        raise ConfigurationError(
            f"invalid {option} {_shown(text)}: only ASCII digits 0-9 and the units ms, s, min, "
            f"h, d are allowed (found {foreign})",
            option=option,
        )
    if m is None:
        raise ConfigurationError(
            f"invalid {option} {_shown(text)}: expected an integer followed by ms, s, min, h or d "
            f"(e.g. '250ms', '5s'), with no space or fraction",
            option=option,
        )
    digits = m.group(1).lstrip("0")
    # More digits than a float can hold is no duration: int() refuses over 4300 digits and the
    # division overflows long before; either way the caller gets the error, not a crash.
    if len(digits) <= _MAX_DIGITS:
        try:
            return int(digits or "0") * _UNITS_MS[m.group(2)] / 1000
        except OverflowError:
            pass
    raise ConfigurationError(
        f"invalid {option} {_shown(text)}: too large to represent (a number of "
        f"{len(digits)} digits); use math.inf for no bound",
        option=option,
    )


def _shown(text: str) -> str:
    """``text`` for an error message: a value thousands of characters long is cut."""
    if len(text) <= 40:
        return repr(text)
    return f"{text[:20]!r}…{text[-6:]!r} ({len(text)} characters)"


def to_seconds(
    value: Duration,
    *,
    option: str = "duration",
    allow_zero: bool = True,
    negative_is_zero: bool = False,
) -> float:
    """Convert any accepted duration form to float seconds, validating it.

    NaN, values too large for a float, negative values (unless ``negative_is_zero``: then a
    relative timeout that is already over, D1.9) and (unless ``allow_zero``) zero raise
    :class:`ConfigurationError` naming ``option``. ``math.inf`` is accepted: "no bound".
    """
    if isinstance(value, bool):
        raise ConfigurationError(f"{option} must be a duration, not a bool", option=option)
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ConfigurationError(
                f"{option} is too large to represent ({len(str(value))} digits); "
                "use math.inf for no bound",
                option=option,
            ) from None
    elif isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        seconds = parse_duration(value, option=option)
    else:
        raise ConfigurationError(
            f"{option} must be seconds, a timedelta or a string like '250ms', "
            f"not {type(value).__name__}",
            option=option,
        )
    if math.isnan(seconds):
        raise ConfigurationError(f"{option} must not be NaN", option=option)
    if seconds < 0 and negative_is_zero:
        return 0.0
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{option} must be {bound}, got {value!r}", option=option)
    return seconds


def ceil_ms(seconds: float) -> int:
    """``seconds`` in whole milliseconds, rounded **up**: the one rounding of a span written to a
    row or sent on the wire (D1.13, D4.3), so the reader never sees less time than we have.
    ``round(…, 6)`` first absorbs float noise such as ``0.3 * 1000 == 300.00000000000006``."""
    return math.ceil(round(seconds * 1000, 6))


def to_ms(value: Duration, *, option: str = "duration", allow_zero: bool = True) -> int:
    """A finite duration as whole milliseconds for a stored or sent field (D1.2), rounded **up**:
    a bound written from it is never shorter than asked (D1.3). Validated as :func:`to_seconds`
    does; ``math.inf`` (no bound) is refused, there is no integer for it."""
    seconds = to_seconds(value, option=option, allow_zero=allow_zero)
    if math.isinf(seconds):
        raise ConfigurationError(f"{option} must be a finite duration", option=option)
    ms = ceil_ms(seconds)
    if ms == 0 and seconds > 0:
        ms = 1
    return ms


def format_duration(seconds: float) -> str:
    """Render a duration the one way timebound shows it (D1.14): in errors, events, the CLI and
    the host's pages alike.

    Under a second in milliseconds (``250ms``, ``0.5ms``), under a minute in seconds to the
    millisecond (``1.5s``, ``59.999s``), from a minute on in whole units, largest first
    (``2min``, ``3min 4s``, ``1h 30min``, ``1d 1h``); ``math.inf`` is ``never``. A whole
    value reads as a duration literal of the language (``120`` is ``2min``, which parses back).
    """
    if math.isnan(seconds):
        return "NaN"
    if math.isinf(seconds):
        return "never" if seconds > 0 else "-never"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    ms = round(seconds * 1000, 3)
    if ms < 1000:
        return f"{ms:g}ms"
    whole_ms = round(seconds * 1000)
    if whole_ms < 60_000:
        return f"{whole_ms / 1000:g}s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        count, whole_ms = divmod(whole_ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if whole_ms:
        parts.append(f"{whole_ms / 1000:g}s")
    return " ".join(parts)
