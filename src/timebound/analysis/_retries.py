"""The worst case of a retry loop, read from the policy's own :class:`RetryPlan` (D14.2).

The schedule is the plan's: the waits come from :meth:`RetryPlan.delay_bounds` (the backoff, the
cap and the most jitter can add, D3.2), and an attempt starts under the plan's own deadline-first
rule (D3.3): after failed attempt *k*, which ended at *e*, the next one starts only when *e* lies
before the budget and the wait is shorter than what the budget leaves (``wait >= left`` stops the
loop without sleeping). Three schedules are followed:

- *errors*: every attempt fails at once and every wait is its shortest: an attempt this one
  cannot reach never starts, whatever happens (TB-T001);
- *timeouts*: every attempt runs to its timeout and every wait is its shortest (TB-T002);
- *worst*: every attempt runs to its timeout and every wait is its longest (TB-T003), which is
  also the loop's worst-case time.

The budget is the earlier of the plan's ``total_timeout`` and the caller's budget. Loops of more
than :data:`MAX_STEPS` attempts are followed step by step that far, and then in strides once
their waits no longer change (fixed, or at the cap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from .._core._errors import DeadlineExceeded
from ..policies._retry import RetryPlan
from ._findings import Finding, Location, shown

__all__ = ["MAX_STEPS", "LoopBound", "retry_findings", "worst_case"]

#: Attempts followed one by one; past this the waits must have become constant (they have for
#: ``fixed`` and for any schedule at its cap) to be followed further in strides.
MAX_STEPS: Final = 100_000
_INF: Final = math.inf


@dataclass(frozen=True, slots=True)
class LoopBound:
    """The bound a retry loop runs under: ``seconds`` and who set it (``total_timeout`` or
    ``the caller's budget``)."""

    seconds: float
    source: str


#: How findings name a loop's bound when it is the caller's budget.
LOOP_CALLER = "the caller's budget"


def budget_of(plan: RetryPlan, caller: float | None) -> LoopBound | None:
    total = plan.total_timeout
    if total is not None and (caller is None or total <= caller):
        return LoopBound(total, "total_timeout")
    if caller is not None:
        return LoopBound(caller, LOOP_CALLER)
    return None


@dataclass(slots=True)
class _Track:
    """One schedule: when the current attempt starts, and the first attempt that does not."""

    attempt_time: float  # what each attempt takes in this schedule
    longest: bool  # the longest waits (jitter at its most) or the shortest
    start: float = 0.0
    stopped: int | None = None  # the first attempt that does not start
    cut: bool = False  # the attempt before it was cut by the budget (not stopped before a wait)
    end: float = 0.0  # when the loop ends in this schedule
    waits: float = 0.0  # the waits taken so far
    refused: float = 0.0  # the wait that was not started (the loop stopped before it)

    def step(self, plan: RetryPlan, k: int, budget: float) -> None:
        """Attempt ``k`` (started at ``self.start``) failed: does ``k + 1`` start?"""
        ended = self.start + self.attempt_time
        if ended >= budget:
            self.stopped, self.cut, self.end = k + 1, True, budget
            return
        shortest, longest = plan.delay_bounds(k)
        wait = longest if self.longest else shortest
        if wait >= budget - ended:  # D3.3: `wait >= left` stops the loop without sleeping
            self.stopped, self.end, self.refused = k + 1, ended, wait
            return
        self.start = ended + wait
        self.waits += wait


def _stride(track: _Track, plan: RetryPlan, k: int, last: int, budget: float) -> int:
    """Jump ``track`` over attempts ``k``..: every step costs the same (the waits no longer
    change). Returns the attempt reached (``last`` when none stops)."""
    shortest, longest = plan.delay_bounds(k)
    wait = longest if track.longest else shortest
    cost = track.attempt_time + wait
    if cost <= 0.0:
        return last
    # Attempt k + j starts at start + j * cost; it fails and the next starts while
    # start + (j + 1) * cost < budget. Count the steps that fit, then finish one by one.
    fits = (budget - track.start) / cost - 1.0
    if not math.isfinite(fits):
        return last  # an infinite budget: every attempt starts
    jump = 0 if fits <= 2 else int(fits) - 1
    jump = min(jump, last - k)
    track.start += jump * cost
    track.waits += jump * wait
    k += jump
    while k < last and track.stopped is None:
        track.step(plan, k, budget)
        k += 1
    return k


def _retries_timeouts(plan: RetryPlan) -> bool:
    """Whether the plan retries an attempt that timed out (``retry_on`` may exclude it)."""
    retry_on = plan.retry_on
    if retry_on is None:
        return True
    try:
        return bool(retry_on(DeadlineExceeded(source="attempt", what=plan.what)))
    except Exception:
        return True  # a predicate that cannot judge it: assume the retry is meant


@dataclass(frozen=True, slots=True)
class Schedules:
    errors: _Track
    timeouts: _Track | None
    worst: _Track | None
    attempts: int


def follow(
    plan: RetryPlan, timeout: float | None, budget: float, timeouts_retried: bool | None = None
) -> Schedules:
    """The three schedules of ``plan`` under ``budget`` seconds (``timeouts_retried``: whether
    a timed-out attempt is retried; by default the plan's ``retry_on`` says)."""
    attempts = plan.retry + 1
    errors = _Track(0.0, longest=False)
    if timeouts_retried is None:
        timeouts_retried = _retries_timeouts(plan)
    timed = timeout is not None and timeouts_retried
    timeouts = _Track(timeout, longest=False) if timed and timeout is not None else None
    worst = _Track(timeout, longest=True) if timed and timeout is not None else None
    tracks = [t for t in (errors, timeouts, worst) if t is not None]
    last = attempts  # failed attempt numbers run 1 .. attempts - 1
    k = 1
    while k < last and k <= MAX_STEPS and any(t.stopped is None for t in tracks):
        for t in tracks:
            if t.stopped is None:
                t.step(plan, k, budget)
        k += 1
    reached = {id(t): k for t in tracks}
    if k < last and k > MAX_STEPS:
        for t in tracks:
            if t.stopped is None and _constant(plan, k):
                reached[id(t)] = _stride(t, plan, k, last, budget)
    for t in tracks:
        if t.stopped is not None:
            continue
        if reached[id(t)] >= last:  # every attempt started: the loop ends with the last one
            t.end = min(t.start + t.attempt_time, budget)
        else:
            # Waits still growing past MAX_STEPS attempts (a linear backoff from a tiny delay):
            # not followed further, so nothing is claimed but that the budget ends the loop.
            t.end = budget
    return Schedules(errors, timeouts, worst, attempts)


def _constant(plan: RetryPlan, k: int) -> bool:
    """The waits after attempt ``k`` no longer change (fixed without jitter, or at the cap)."""
    shortest, longest = plan.delay_bounds(k)
    return shortest == longest and (plan.backoff == "fixed" or shortest == plan.max_delay)


def unbounded(plan: RetryPlan, timeout: float | None) -> float:
    """What every attempt and every wait take at their longest, with no budget to stop them:
    the least budget that lets every attempt run (``inf`` without an attempt timeout)."""
    if timeout is None:
        return _INF
    total = 0.0
    for k in range(1, min(plan.retry + 1, MAX_STEPS)):
        total += timeout + plan.delay_bounds(k)[1]
    if plan.retry + 1 > MAX_STEPS:
        if not _constant(plan, MAX_STEPS):
            return _INF
        total += _times(plan.retry + 1 - MAX_STEPS, timeout + plan.delay_bounds(MAX_STEPS)[1])
    return total + timeout


def worst_case(plan: RetryPlan, timeout: float | None, caller: float | None) -> float:
    """The loop's worst-case time in seconds (``inf`` when nothing bounds it): every attempt
    runs to its timeout, every wait is its longest, the budget ends it."""
    bound = budget_of(plan, caller)
    if bound is None:
        return unbounded(plan, timeout)
    if timeout is None:
        return bound.seconds
    worst = follow(plan, timeout, bound.seconds).worst
    assert worst is not None or not _retries_timeouts(plan)
    return bound.seconds if worst is None else worst.end


def _times(n: int, seconds: float) -> float:
    """``n * seconds`` for a count that may be past what a float holds: infinity then."""
    try:
        return n * seconds
    except OverflowError:
        return _INF


def _falls_back_on_timeouts(plan: RetryPlan) -> bool:
    """Whether the plan's fallback covers a loop that ended in timed-out attempts
    (``fallback_on`` may name other errors only)."""
    kinds = plan.fallback_on
    return kinds is None or issubclass(DeadlineExceeded, kinds)


def count(n: int) -> str:
    """A count as text; one too long to read is shown by its order of magnitude."""
    return str(n) if n < 10**15 else f"about 10^{len(str(n)) - 1}"


def _raise_or_lower(name: str, needed: float, k: int) -> str:
    lower = f"lower retry to {count(k - 2)}, or shorten the timeout"
    if math.isfinite(needed):
        return f"raise {name} above {shown(needed)} (every attempt and wait), {lower}"
    return lower[0].upper() + lower[1:]


def retry_findings(
    plan: RetryPlan,
    timeout: float | None,
    *,
    caller: float | None,
    fallback: bool,
    subject: str,
    where: Location,
    timeout_where: Location | None = None,
    site: Location | None = None,
    budget_name: str | None = None,
    timeouts_retried: bool | None = None,
    reserve: float = 0.0,
    reserve_where: Location | None = None,
) -> list[Finding]:
    """TB-T001..TB-T005 and the loop's worst-case time (TB-T030/TB-T031) for one policy.

    With a ``reserve`` (D1.18) the attempts and waits see the caller's budget less it, and the
    fallback runs in the reserve: one at or above the caller's budget leaves no attempt
    (TB-T034, D1.20)."""
    out: list[Finding] = []
    if reserve and caller is not None:
        if reserve >= caller:
            return [
                Finding(
                    "TB-T034",
                    subject,
                    f"the reserve of {shown(reserve)} is at least the caller's budget "
                    f"({shown(caller)}): the call is refused at once every time and no attempt "
                    "ever runs (D1.20)",
                    reserve_where or where,
                    f"lower the reserve well below {shown(caller)}",
                    {"reserve": reserve, "budget": caller},
                )
            ]
        # What the loop sees; the fallback keeps the reserve, so it always has time (D1.18).
        caller, fallback = caller - reserve, False
        budget_name = f"{budget_name or LOOP_CALLER} less the reserve"
    bound = budget_of(plan, caller)
    attempts = plan.retry + 1
    fallback = fallback and _falls_back_on_timeouts(plan)
    worst_time = worst_case(plan, timeout, caller)
    if bound is not None:
        name = _name(bound, budget_name)
        budget = bound.seconds
        if timeout is not None and timeout >= budget:
            out.append(
                Finding(
                    "TB-T004",
                    subject,
                    f"the attempt timeout of {shown(timeout)} never fires: {name} of "
                    f"{shown(budget)} always ends the attempt first, so a hung attempt is "
                    "never retried (D2.5)",
                    timeout_where or where,
                    f"lower the timeout below {shown(budget)}, or raise {name} above "
                    f"{shown(timeout)}",
                    {"timeout": timeout, "budget": budget},
                )
            )
        if attempts > 1:
            s = follow(plan, timeout, budget, timeouts_retried)
            if s.errors.stopped is not None:
                k = s.errors.stopped
                waits = s.errors.waits + s.errors.refused
                out.append(
                    Finding(
                        "TB-T001",
                        subject,
                        f"attempt {count(k)} of {count(attempts)} can never start: the waits "
                        f"before it alone ({shown(waits)}) reach {name} of {shown(budget)}, "
                        "however fast the attempts before it fail (D3.3)",
                        where,
                        f"lower retry to {count(k - 2)}, shorten the delay or its backoff, or "
                        f"raise {name} above {shown(waits)}",
                        {"attempt": k, "attempts": attempts, "delays": waits, "budget": budget},
                        frozenset({"attempt", "attempts"}),
                    )
                )
            t = s.timeouts
            if t is not None and t.stopped is not None and (s.errors.stopped or _INF) > t.stopped:
                k = t.stopped
                waits = t.waits + t.refused
                assert timeout is not None
                spent = t.end + t.refused
                if timeout < budget:
                    how = (
                        f"{count(k - 1)} timed-out attempts of {shown(timeout)} and the waits "
                        f"after them ({shown(waits)}) take {shown(spent)}"
                        if not t.cut
                        else f"attempt {count(k - 1)} is cut by {name} before its own timeout fires"
                    )
                    msg = (
                        f"attempt {count(k)} of {count(attempts)} never starts after timed-out "
                        f"attempts: {how}, and {name} is {shown(budget)} (D3.3)"
                    )
                else:
                    msg = (
                        f"attempt {count(k)} of {count(attempts)} never starts after a "
                        f"timed-out attempt: {name} of {shown(budget)} cuts attempt 1 before "
                        f"its {shown(timeout)} timeout, and that is not retried (D2.5)"
                    )
                out.append(
                    Finding(
                        "TB-T002",
                        subject,
                        msg,
                        where,
                        _raise_or_lower(name, unbounded(plan, timeout), k),
                        {
                            "attempt": k,
                            "attempts": attempts,
                            "timeout": timeout,
                            "delays": waits,
                            "needed": spent,
                            "budget": budget,
                        },
                        frozenset({"attempt", "attempts"}),
                    )
                )
            w = s.worst
            if (
                w is not None
                and w.stopped is not None
                and (t is None or t.stopped is None or w.stopped < t.stopped)
                and (s.errors.stopped or _INF) > w.stopped
            ):
                k = w.stopped
                longest = w.waits + w.refused
                shortest = sum(plan.delay_bounds(j)[0] for j in range(1, min(k, MAX_STEPS)))
                assert timeout is not None
                out.append(
                    Finding(
                        "TB-T003",
                        subject,
                        f"attempt {count(k)} of {count(attempts)} may not start after timed-out "
                        f"attempts: with the most jitter the waits before it take "
                        f"{shown(longest)} (without, {shown(shortest)}), and {count(k - 1)} "
                        f"attempts of {shown(timeout)} with them reach {name} of {shown(budget)}",
                        where,
                        f"lower the jitter or max_delay, or raise {name} above "
                        f"{shown(w.end + w.refused)}",
                        {
                            "attempt": k,
                            "attempts": attempts,
                            "timeout": timeout,
                            "delays": shortest,
                            "delays_with_jitter": longest,
                            "budget": budget,
                        },
                        frozenset({"attempt", "attempts"}),
                    )
                )
            if (
                fallback
                and caller is not None
                and t is not None
                and bound.source != "total_timeout"
                and (t.stopped is not None or t.end >= caller)
            ):
                out.append(
                    Finding(
                        "TB-T005",
                        subject,
                        f"the fallback has no time left after timed-out attempts: the retry "
                        f"loop runs until the caller's budget of {shown(caller)} is spent, and "
                        "a spent caller deadline never runs a fallback (D3.4)",
                        where,
                        f"give the loop a total_timeout below {shown(caller)}, or fewer or "
                        "shorter attempts, so the fallback runs in time",
                        {"budget": caller, "worst_case": unbounded(plan, timeout)},
                    )
                )
        elif (
            fallback
            and caller is not None
            and bound.source != "total_timeout"
            and timeout is not None
            and timeout >= caller
        ):
            out.append(
                Finding(
                    "TB-T005",
                    subject,
                    f"the fallback has no time left after a timed-out attempt: the attempt "
                    f"runs until the caller's budget of {shown(caller)} is spent, and a spent "
                    "caller deadline never runs a fallback (D3.4)",
                    where,
                    f"lower the timeout below {shown(caller)} so the fallback runs in time",
                    {"budget": caller, "worst_case": timeout},
                )
            )
    if math.isfinite(worst_time):
        out.append(
            Finding(
                "TB-T030",
                subject,
                f"worst case {shown(worst_time)}: " + _composition(plan, timeout, attempts, bound),
                site or where,
                numbers={"worst_case": worst_time, "attempts": attempts},
                counts=frozenset({"attempts"}),
            )
        )
    full = unbounded(plan, timeout)
    if (
        bound is not None
        and math.isfinite(full)
        and full > bound.seconds
        and not any(f.severity == "error" for f in out)
    ):
        out.append(
            Finding(
                "TB-T031",
                subject,
                f"every attempt and wait at their longest take {shown(full)}, more than "
                f"{_name(bound, budget_name)} ({shown(bound.seconds)}): the last attempts are cut "
                "short in the worst case",
                site or where,
                f"size the budget above {shown(full)}, or shorten the attempts",
                {"worst_case": full, "budget": bound.seconds},
            )
        )
    return out


def _name(bound: LoopBound, budget_name: str | None) -> str:
    """How findings call the loop's bound: ``budget_name`` names the caller's budget where it
    has a name of its own (the workflow timeout around a node's retries)."""
    return bound.source if budget_name is None or bound.source == "total_timeout" else budget_name


def _composition(
    plan: RetryPlan, timeout: float | None, attempts: int, bound: LoopBound | None
) -> str:
    parts = [f"{count(attempts)} attempt{'s' if attempts != 1 else ''}"]
    parts.append("no attempt timeout" if timeout is None else f"{shown(timeout)} each")
    if attempts > 1 and plan.delay is not None:
        parts.append(f"{plan.backoff} waits from {shown(plan.delay)}, cap {shown(plan.max_delay)}")
        if plan.jitter is not False:
            parts.append(
                "jitter "
                + (
                    "up to the wait"
                    if plan.jitter is True
                    else f"up to {shown(float(plan.jitter))}"
                )
            )
    if bound is not None:
        parts.append(f"bounded by {bound.source} ({shown(bound.seconds)})")
    return ", ".join(parts)
