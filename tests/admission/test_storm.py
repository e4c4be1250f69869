"""Storm: random arrivals, finishes, time-outs and cancellations at random instants (D9)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from timebound.admission import (
    Admission,
    AdmissionConfig,
    AIMDLimit,
    Ticket,
    Verdict,
)


@pytest.mark.parametrize("seed", range(20))
def test_slots_and_tickets_stay_consistent_under_a_storm(seed: int) -> None:
    """Whatever the order of events, every ticket ends once and no slot is lost or doubled."""
    rng = random.Random(seed)
    adm = Admission(
        AIMDLimit(4, maximum=8, backoff=0.5), AdmissionConfig(max_queue=6, interval=0.05)
    )
    now = 0.0
    running: list[Ticket] = []
    waiting: list[Ticket] = []
    wakes: dict[int, int] = {}
    for _ in range(600):
        now += rng.choice((0.0, 0.001, 0.004, 0.02))
        action = rng.random()
        if action < 0.45:
            deadline = None if rng.random() < 0.3 else now + rng.uniform(0.0, 0.2)
            t = Ticket(rng.choice("abc"), deadline, critical=rng.random() < 0.2)
            t.wake = counter(wakes, len(wakes))
            outcome = adm.arrive(t, now)
            (running if outcome is Verdict.ADMIT else waiting).append(t)
        elif action < 0.75 and running:
            t = running.pop(rng.randrange(len(running)))
            adm.release(t, now, late=t.deadline is not None and now >= t.deadline)
        elif waiting:
            t = waiting[rng.randrange(len(waiting))]
            if action < 0.9:
                outcome = adm.give_up(t, max(now, adm.wait_until(t, now)))
            else:
                adm.cancel(t, now)
                outcome = Verdict.OVERLOADED
            if outcome is not Verdict.QUEUED:
                waiting.remove(t)
                if outcome is Verdict.ADMIT:
                    running.append(t)
        # Waiters woken since: admitted ones now run, shed ones are gone.
        for t in list(waiting):
            if t.outcome is Verdict.ADMIT:
                waiting.remove(t)
                running.append(t)
            elif t.outcome in (Verdict.HOPELESS, Verdict.OVERLOADED):
                waiting.remove(t)
        assert adm.inflight == len(running)
        assert adm.queued() == len(waiting)
        assert adm.inflight <= 8
    assert all(count <= 1 for count in wakes.values())


def counter(wakes: dict[int, int], key: int) -> Callable[[Verdict], None]:
    """A ``wake`` that counts how often ticket ``key`` was woken."""
    wakes[key] = 0

    def wake(_outcome: Verdict) -> None:
        wakes[key] += 1

    return wake
