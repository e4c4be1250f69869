"""A serial handler behind :class:`Admission`, simulated on virtual time (no clock, no loop).

The shape of the propagation benchmark's bottleneck: one worker (or ``workers``) inside the app
takes admitted requests in arrival order and works each for ``service`` seconds, in quanta,
stopping at the first quantum past the request's deadline (a checkpoint). Arrivals are Poisson
with a fixed seed, so every run is the same run. The admission layer cannot see the workers: it
must learn from service times alone that admitting more at once only makes requests queue
inside.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass

from timebound.admission import Admission, Ticket, Verdict


@dataclass
class Result:
    sent: int = 0
    good: int = 0  # finished within the deadline
    late: int = 0  # admitted, then ran out of time inside the app
    shed: int = 0  # answered 498 / 503 by the admission layer
    goodput: float = 0.0  # good per second, as a fraction of the worker's capacity


def simulate(
    adm: Admission,
    rho: float,
    *,
    service: float = 0.040,
    budget: float = 0.245,
    seconds: float = 60.0,
    seed: int = 1,
    quantum: float = 0.0005,
    workers: int = 1,
) -> Result:
    rng = random.Random(seed)
    events: list[tuple[float, int, str, Ticket | None]] = []
    order = itertools.count()

    def at(when: float, kind: str, ticket: Ticket | None = None) -> None:
        heapq.heappush(events, (when, next(order), kind, ticket))

    rate = rho * workers / service
    t = rng.expovariate(rate)
    while t < seconds:
        at(t, "arrive")
        t += rng.expovariate(rate)
    inside: deque[Ticket] = deque()
    busy = 0
    woken: list[tuple[Ticket, Verdict]] = []
    out = Result()

    def start(now: float) -> None:
        nonlocal busy
        if busy == workers or not inside:
            return
        ticket = inside.popleft()
        busy += 1
        assert ticket.deadline is not None
        if now + service <= ticket.deadline:
            at(now + service, "good", ticket)
        else:  # stops at the first checkpoint past its deadline
            left = max(0.0, ticket.deadline - now)
            at(now + (int(left / quantum) + 1) * quantum, "late", ticket)

    def settle(ticket: Ticket, outcome: Verdict, now: float) -> None:
        if outcome is Verdict.ADMIT:
            inside.append(ticket)
            start(now)
        elif outcome is Verdict.QUEUED:
            at(adm.wait_until(ticket, now), "timer", ticket)
        else:
            out.shed += 1

    while events:
        now, _, kind, ticket = heapq.heappop(events)
        if kind == "arrive":
            out.sent += 1
            ticket = Ticket("GET /", now + budget)
            ticket.wake = lambda outcome, ticket=ticket: woken.append((ticket, outcome))
            settle(ticket, adm.arrive(ticket, now), now)
        elif kind == "timer":
            assert ticket is not None
            if ticket.outcome is Verdict.QUEUED:
                outcome = adm.give_up(ticket, now)
                if outcome is Verdict.QUEUED:
                    at(max(now, adm.wait_until(ticket, now)), "timer", ticket)
                else:
                    settle(ticket, outcome, now)
        else:
            assert ticket is not None
            busy -= 1
            out.good += kind == "good"
            out.late += kind == "late"
            adm.release(ticket, now, late=kind == "late")
        for waiter, outcome in woken:
            settle(waiter, outcome, now)
        woken.clear()
        start(now)
    out.goodput = out.good / seconds * service / workers
    return out
