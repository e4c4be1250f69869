"""The module-call options (``with timeout: 2s, retry: 3, ...``): one table, read by the parser
(what each option's value looks like, which values are refused) and by the compiler (what the
call site's :class:`~timebound.policies.Policy` receives). The value lists of ``backoff`` and
``on_error`` are the policies' own, the duration units the core's: one definition each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .._core._durations import _UNITS_MS as DURATION_UNITS_MS
from ..policies._options import BACKOFFS, ON_ERROR_MODES

__all__ = [
    "BACKOFFS",
    "DURATION_UNITS_MS",
    "ON_ERROR_MODES",
    "OPTIONS",
    "OptionSpec",
    "PRIORITIES",
]

PRIORITIES: Final = {"critical": 100, "high": 80, "normal": 50, "low": 20, "background": 0}


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option.

    ``kind`` says what its value is: ``duration`` (seconds), ``count`` (a whole number),
    ``choice`` (one of ``choices``), ``flag`` (true/false; bare ``lazy`` means true),
    ``priority`` (a level name or an integer), ``string`` (a plain string literal), ``rate``
    (``COUNT/DURATION``), ``learnable`` (a duration, or a whole percentile ``pNN`` of the call
    site's recent latencies) or ``expression`` (``fallback``). ``expects`` ends the E013
    message for a value of the wrong form; ``positive`` makes zero and negative values E016;
    ``policy`` turns the parsed value into the Policy keyword of the same name (None: not a
    Policy option).
    """

    name: str
    kind: str
    expects: str
    choices: tuple[str, ...] = ()
    positive: bool = False
    policy: Callable[[Any], Any] | None = _same


_DURATION = "a duration literal such as 250ms, 5s, 2min, 1h or 1d"
_COUNT = "a whole number literal"

OPTIONS: Final[dict[str, OptionSpec]] = {
    spec.name: spec
    for spec in (
        OptionSpec("retry", "count", _COUNT),
        # A percentile (`p99`) is a timebound extension (D3.16): the attempt timeout is learned
        # from the call site's recent latencies, never below `timeout_floor` (D3.15).
        OptionSpec(
            "timeout",
            "learnable",
            "a duration literal such as 250ms, 5s, 2min, 1h or 1d, or a percentile p1 to p99 "
            "such as p99",
            positive=True,
        ),
        OptionSpec("timeout_floor", "duration", _DURATION, positive=True),
        OptionSpec("delay", "duration", _DURATION, positive=True),
        OptionSpec("cache", "duration", _DURATION, positive=True),
        OptionSpec("backoff", "choice", "one of " + ", ".join(BACKOFFS), BACKOFFS),
        OptionSpec("fallback", "expression", "an expression", policy=None),
        OptionSpec("cache_backend", "string", "a string literal without interpolation"),
        # Policy parses the rate's text itself; the compiler keeps (count, seconds, text).
        OptionSpec(
            "throttle",
            "rate",
            "a rate literal COUNT/DURATION such as 10/1s",
            positive=True,
            policy=lambda value: value[2],
        ),
        OptionSpec("concurrency", "count", _COUNT, positive=True),
        # A timebound extension (D3.16): a fixed hedging delay, or a percentile (`p95`) of the
        # call site's recent latencies; Policy reads either (seconds, or the text "p95").
        OptionSpec(
            "hedge",
            "learnable",
            "a duration literal such as 20ms or a percentile p1 to p99 such as p95",
            positive=True,
        ),
        OptionSpec("on_error", "choice", "one of " + ", ".join(ON_ERROR_MODES), ON_ERROR_MODES),
        # D1.18: the attempts see the call's deadline less this; the fallback keeps it.
        OptionSpec("reserve", "duration", _DURATION, positive=True),
        OptionSpec("lazy", "flag", "true or false", policy=None),
        OptionSpec(
            "priority",
            "priority",
            "critical, high, normal, low, background or an integer",
            policy=None,
        ),
    )
}
