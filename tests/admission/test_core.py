"""The admission discipline (D9) on explicit instants: every decision at an exact time."""

from __future__ import annotations

import pytest

from timebound import ConfigurationError
from timebound.admission import (
    Admission,
    AdmissionConfig,
    AIMDLimit,
    FixedLimit,
    RouteEstimates,
    Ticket,
    Verdict,
)
from timebound.telemetry import counters

from ._serial import simulate


def shed(reason: str) -> int:
    return counters.get("admission-shed", component="http-server", reason=reason)


def make(limit: int = 1, **config: float) -> Admission:
    return Admission(FixedLimit(limit), AdmissionConfig(**config))  # type: ignore[arg-type]


def test_under_the_limit_a_request_runs_at_once() -> None:
    """A request arriving below the concurrency limit is admitted."""
    adm = make(limit=2)
    assert adm.arrive(Ticket("GET /", None), 0.0) is Verdict.ADMIT
    assert adm.inflight == 1
    assert counters.get("admission-admitted", component="http-server") == 1


def test_at_the_limit_a_request_queues_and_a_release_admits_it() -> None:
    """A request over the limit waits, and the next release admits it and wakes it."""
    adm = make(limit=1)
    first, second = Ticket("GET /", None), Ticket("GET /", None)
    woken: list[Verdict] = []
    second.wake = woken.append
    adm.arrive(first, 0.0)
    assert adm.arrive(second, 0.0) is Verdict.QUEUED
    adm.release(first, 0.03125, late=False)
    assert woken == [Verdict.ADMIT] and adm.inflight == 1 and adm.queued() == 0


def test_hopeless_request_is_answered_on_arrival() -> None:
    """A budget below the route's expected service time is shed as hopeless before running."""
    adm = make(limit=4)
    adm.estimates.observe("GET /slow", 0.5)
    assert adm.arrive(Ticket("GET /slow", deadline=10.25), 10.0) is Verdict.HOPELESS
    assert adm.inflight == 0 and shed("deadline") == 1


def test_unknown_route_is_never_shed_as_hopeless() -> None:
    """A route with no measured handler time admits any request with budget left."""
    adm = make(limit=4)
    assert adm.arrive(Ticket("GET /new", deadline=10.001), 10.0) is Verdict.ADMIT


def test_budget_equal_to_the_estimate_is_hopeless() -> None:
    """Exactly the expected service time left is not enough (the answer would be late)."""
    adm = make(limit=4)
    adm.estimates.observe("r", 0.25)
    assert adm.arrive(Ticket("r", deadline=1.25), 1.0) is Verdict.HOPELESS


def test_normal_queue_is_first_in_first_out() -> None:
    """While the queue is not standing, waiters are admitted oldest first."""
    adm = make(limit=1)
    running = Ticket("r", None)
    adm.arrive(running, 0.0)
    order: list[str] = []
    for name in ("a", "b"):
        t = Ticket(name, None)
        t.wake = lambda _o, n=name: order.append(n)
        adm.arrive(t, 0.0)
    adm.release(running, 0.001, late=False)
    assert order == ["a"]


def test_standing_queue_serves_newest_first() -> None:
    """Once the queue has not emptied for longer than ``interval``, the newest waiter goes first."""
    adm = make(limit=1, interval=0.125, target=0.0625)
    running = Ticket("r", None)
    adm.arrive(running, 0.0)
    tickets = {}
    for name, at in (("old", 0.0), ("new", 0.125)):
        tickets[name] = Ticket(name, None)
        adm.arrive(tickets[name], at)
    adm.release(running, 0.15625, late=False)
    assert tickets["new"].outcome is Verdict.ADMIT


def test_standing_queue_sheds_waiters_older_than_target() -> None:
    """Under adaptive LIFO, waiters that exceeded ``target`` are shed with 503, not left to rot."""
    adm = make(limit=1, interval=0.125, target=0.0625)
    running = Ticket("r", None)
    adm.arrive(running, 0.0)
    old, new = Ticket("old", None), Ticket("new", None)
    adm.arrive(old, 0.0)
    adm.arrive(new, 0.125)
    adm.release(running, 0.15625, late=False)
    assert old.outcome is Verdict.OVERLOADED and shed("queue-delay") == 1


def test_full_queue_sheds_with_overload() -> None:
    """A request meeting a full queue is answered 503 at once."""
    adm = make(limit=1, max_queue=1)
    adm.arrive(Ticket("r", None), 0.0)
    adm.arrive(Ticket("r", None), 0.0)
    assert adm.arrive(Ticket("r", None), 0.0) is Verdict.OVERLOADED
    assert shed("queue-full") == 1


def test_critical_request_takes_the_place_of_the_oldest_normal_one() -> None:
    """A critical request meeting a full queue evicts the oldest normal waiter."""
    adm = make(limit=1, max_queue=1)
    adm.arrive(Ticket("r", None), 0.0)
    normal = Ticket("r", None)
    woken: list[Verdict] = []
    normal.wake = woken.append
    adm.arrive(normal, 0.0)
    assert adm.arrive(Ticket("r", None, critical=True), 0.0) is Verdict.QUEUED
    assert woken == [Verdict.OVERLOADED]


def test_critical_waiter_is_admitted_before_older_normal_ones() -> None:
    """Critical traffic goes first whatever the arrival order."""
    adm = make(limit=1)
    running = Ticket("r", None)
    adm.arrive(running, 0.0)
    normal, critical = Ticket("r", None), Ticket("r", None, critical=True)
    adm.arrive(normal, 0.0)
    adm.arrive(critical, 0.001)
    adm.release(running, 0.002, late=False)
    assert critical.outcome is Verdict.ADMIT and normal.outcome is Verdict.QUEUED


def test_request_without_deadline_keeps_its_place_among_deadline_requests() -> None:
    """An older waiter without a deadline goes before newer ones with one (D9.2)."""
    adm = make(limit=1)
    running = Ticket("r", None)
    adm.arrive(running, 0.0)
    plain = Ticket("r", None)
    adm.arrive(plain, 0.0)
    adm.arrive(Ticket("r", deadline=5.0), 0.001)
    adm.release(running, 0.002, late=False)
    assert plain.outcome is Verdict.ADMIT


def test_wait_until_is_the_instant_a_waiter_becomes_hopeless() -> None:
    """A waiter's bound is its deadline minus the expected service time, when that is earliest."""
    adm = make(limit=1, interval=1.0)
    adm.estimates.observe("r", 0.25)
    adm.arrive(Ticket("r", None), 0.0)
    t = Ticket("r", deadline=0.5)
    adm.arrive(t, 0.0)
    assert adm.wait_until(t, 0.0) == 0.25
    assert adm.give_up(t, 0.25) is Verdict.HOPELESS and adm.queued() == 0


def test_waiting_longer_than_interval_sheds_with_overload() -> None:
    """A waiter without a deadline is shed 503 after ``interval`` in a non-standing queue."""
    adm = make(limit=1, interval=0.125, target=0.0625)
    adm.arrive(Ticket("r", None), 0.0)
    t = Ticket("r", None)
    adm.arrive(t, 0.0)
    assert adm.wait_until(t, 0.0) == 0.125
    assert adm.give_up(t, 0.0625) is Verdict.QUEUED
    assert adm.give_up(t, 0.125) is Verdict.OVERLOADED and shed("queue-delay") == 1


def test_give_up_after_admission_returns_the_slot_to_the_caller() -> None:
    """A waiter admitted just before its timer fired still runs."""
    adm = make(limit=1)
    running, t = Ticket("r", None), Ticket("r", None)
    adm.arrive(running, 0.0)
    adm.arrive(t, 0.0)
    adm.release(running, 0.001, late=False)
    assert adm.give_up(t, 0.2) is Verdict.ADMIT and adm.inflight == 1


def test_cancelled_waiter_leaves_no_ticket() -> None:
    """A waiter that goes away is removed from the queue."""
    adm = make(limit=1)
    adm.arrive(Ticket("r", None), 0.0)
    t = Ticket("r", None)
    adm.arrive(t, 0.0)
    adm.cancel(t, 0.001)
    assert adm.queued() == 0 and adm.inflight == 1


def test_cancelled_after_admission_gives_back_the_slot() -> None:
    """A waiter admitted and then cancelled before running frees its slot."""
    adm = make(limit=1)
    running, t = Ticket("r", None), Ticket("r", None)
    adm.arrive(running, 0.0)
    adm.arrive(t, 0.0)
    adm.release(running, 0.001, late=False)
    adm.cancel(t, 0.002)
    assert adm.inflight == 0


def test_release_learns_the_route_service_time() -> None:
    """The handler time of a finished request feeds its route's estimate."""
    adm = make(limit=1)
    t = Ticket("GET /a", None)
    adm.arrive(t, 1.0)
    adm.release(t, 1.25, late=False)
    assert adm.estimates.get("GET /a") == 0.25


def test_queue_delay_histogram_counts_admitted_waits() -> None:
    """The queue delay of each waiter admitted from the queue lands in its bucket."""
    adm = make(limit=1)
    running, t = Ticket("r", None), Ticket("r", None)
    adm.arrive(running, 0.0)
    adm.arrive(t, 0.0)
    adm.release(running, 0.003, late=False)
    stats = adm.stats()
    assert stats.queue_delay_counts[2] == 1 and sum(stats.queue_delay_counts) == 1
    assert stats.queue_delay_sum == 0.003 and stats.limit == 1


def test_ewma_moves_by_alpha() -> None:
    """Each observation moves the estimate by ``alpha`` of the difference."""
    est = RouteEstimates(alpha=0.5)
    est.observe("r", 1.0)
    est.observe("r", 0.5)
    assert est.get("r") == 0.75


def test_route_table_is_bounded() -> None:
    """Past ``max_routes`` the least recently seen route is forgotten (hostile paths)."""
    est = RouteEstimates(max_routes=2)
    for route in ("a", "b", "c"):
        est.observe(route, 1.0)
    assert est.get("a") == 0.0 and est.get("c") == 1.0


def test_aimd_grows_while_the_limit_is_in_use() -> None:
    """A good sample with at least half the limit in flight raises the limit by one."""
    limit = AIMDLimit(4)
    limit.sample(0.01, dropped=False, inflight=2)
    assert limit.value == 5


def test_aimd_does_not_grow_when_idle() -> None:
    """An idle server learns nothing about its capacity."""
    limit = AIMDLimit(4)
    limit.sample(0.01, dropped=False, inflight=1)
    assert limit.value == 4


def test_aimd_backs_off_on_a_late_request() -> None:
    """A request that ended after its deadline multiplies the limit by ``backoff``."""
    limit = AIMDLimit(20, backoff=0.5)
    limit.sample(0.01, dropped=True, inflight=20)
    assert limit.value == 10


def test_aimd_backs_off_on_a_slow_request() -> None:
    """A request slower than ``slow`` counts as a drop."""
    limit = AIMDLimit(20, backoff=0.5, slow=0.1)
    limit.sample(0.25, dropped=False, inflight=20)
    assert limit.value == 10


def test_aimd_stays_within_its_bounds() -> None:
    """The limit never drops below ``minimum`` nor grows past ``maximum``."""
    limit = AIMDLimit(2, minimum=2, maximum=3, backoff=0.5)
    limit.sample(0.01, dropped=True, inflight=2)
    low = limit.value
    for _ in range(5):
        limit.sample(0.01, dropped=False, inflight=3)
    assert (low, limit.value) == (2, 3)


def test_adaptive_limit_drives_admission() -> None:
    """A late finish lowers the limit, so a later arrival queues where it would have run."""
    adm = Admission(AIMDLimit(2, backoff=0.5))
    a, b = Ticket("r", None), Ticket("r", None)
    adm.arrive(a, 0.0)
    adm.arrive(b, 0.0)
    adm.release(a, 1.0, late=True)
    assert adm.stats().limit == 1
    assert adm.arrive(Ticket("r", None), 1.0) is Verdict.QUEUED


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: FixedLimit(0), "limit"),
        (lambda: FixedLimit(1.5), "limit"),  # type: ignore[arg-type]
        (lambda: AIMDLimit(0), "initial"),
        (lambda: AIMDLimit(5, maximum=4), "initial"),
        (lambda: AIMDLimit(backoff=1.0), "backoff"),
        (lambda: AIMDLimit(slow=float("nan")), "slow"),
        (lambda: AdmissionConfig(max_queue=0), "max_queue"),
        (lambda: AdmissionConfig(target=float("inf")), "target"),
        (lambda: AdmissionConfig(target=0.5, interval=0.1), "target"),
        (lambda: AdmissionConfig(retry_after=True), "retry_after"),  # type: ignore[arg-type]
        (lambda: RouteEstimates(alpha=0), "alpha"),
        (lambda: RouteEstimates(max_routes=-1), "max_routes"),
    ],
)
def test_bad_knob_is_refused_by_name(build: object, option: str) -> None:
    """A bad knob raises ConfigurationError naming the option."""
    with pytest.raises(ConfigurationError, match=option) as info:
        build()  # type: ignore[operator]
    assert info.value.option == option


def test_standing_bound_is_at_least_the_route_service_time() -> None:
    """A standing queue keeps a waiter one expected service time when that exceeds ``target``."""
    adm = make(limit=1, interval=0.5, target=0.0625, services=1.0)
    adm.estimates.observe("r", 0.25)
    adm.arrive(Ticket("r", None), 0.0)
    adm.arrive(Ticket("r", None), 0.0)
    late = Ticket("r", None)
    adm.arrive(late, 0.5625)
    assert adm.standing(0.5625) and adm.wait_until(late, 0.5625) == 0.8125


# -- learning the concurrency the server really has (D9.4) -----------------------------------


def _serial_rounds(adm: Admission, rounds: int = 30, service: float = 0.04) -> None:
    """Each round admits as many requests as the limit allows at once; one worker inside the
    app then serves them one after another (nothing ends late)."""
    now = 0.0
    for _ in range(rounds):
        now += 1.0
        tickets = []
        while True:
            t = Ticket("r", None)
            if adm.arrive(t, now) is not Verdict.ADMIT:
                adm.cancel(t, now)
                break
            tickets.append(t)
        for i, t in enumerate(tickets, start=1):
            adm.release(t, now + service * i, late=False)


def test_queueing_inside_the_handler_shrinks_the_adaptive_limit() -> None:
    """Service times rising well above the route's baseline back the limit off, though no
    request ended late: admitted requests were waiting for a worker inside the app."""
    adm = Admission(AIMDLimit(8))
    _serial_rounds(adm)
    assert adm.estimates.baseline("r") == pytest.approx(0.04)
    assert adm.limit.value <= 3


def test_without_tolerance_only_late_requests_back_off() -> None:
    """``tolerance=None`` restores the deadline-only signal: the same rounds grow the limit."""
    adm = Admission(AIMDLimit(8), AdmissionConfig(tolerance=None))
    _serial_rounds(adm)
    assert adm.limit.value > 8


def test_one_decrease_per_window() -> None:
    """A congestion signal from a request admitted before the last decrease is not counted
    again: the decrease already answered the backlog it belonged to."""
    adm = Admission(AIMDLimit(10))
    old = [Ticket("r", None) for _ in range(3)]
    for t in old:
        adm.arrive(t, 0.0)
    adm.release(old[0], 0.5, late=True)
    assert adm.limit.value == 9
    adm.release(old[1], 0.6, late=True)  # admitted before the decrease at 0.5
    assert adm.limit.value == 9
    new = Ticket("r", None)
    adm.arrive(new, 0.7)
    adm.release(new, 0.8, late=True)  # admitted after it: a new signal
    assert adm.limit.value == 8


def test_baseline_rises_only_with_requests_that_ran_alone() -> None:
    """A slower route is learnt from requests with nothing else in flight; concurrent ones
    (which may have queued) only ever lower it."""
    est = RouteEstimates(alpha=0.5)
    est.observe("r", 0.04)
    est.observe("r", 0.2, alone=False)
    assert est.baseline("r") == 0.04 and est.get("r") == 0.12
    est.observe("r", 0.2, alone=True)
    assert est.baseline("r") == 0.12
    assert est.queueing("r", 1.25) and not est.queueing("r", 2.0)


def test_a_request_admitted_alone_is_marked_so() -> None:
    """The first of two concurrent requests ran alone; the second did not."""
    adm = make(limit=2)
    a, b = Ticket("r", None), Ticket("r", None)
    adm.arrive(a, 0.0)
    adm.arrive(b, 0.0)
    assert a.alone and not b.alone


def test_hopeless_is_judged_on_the_baseline_not_on_queueing() -> None:
    """Recent times inflated by queueing do not make a request with enough budget hopeless."""
    adm = make(limit=4)
    adm.estimates.observe("r", 0.04)
    adm.estimates.observe("r", 0.4, alone=False)
    assert adm.estimates.get("r") > 0.1
    assert adm.arrive(Ticket("r", deadline=1.1), 1.0) is Verdict.ADMIT


def test_interval_is_at_least_some_service_times() -> None:
    """A queue of a few slow requests is not standing yet: the interval scales with them."""
    adm = make(limit=1, interval=0.1, services=5.0)
    adm.estimates.observe("r", 0.04)
    assert adm.interval("r") == 0.2
    adm.arrive(Ticket("r", None), 0.0)
    t = Ticket("r", None)
    adm.arrive(t, 0.0)
    assert not adm.standing(0.15) and adm.give_up(t, 0.15) is Verdict.QUEUED


def test_waiter_with_deadline_keeps_the_interval_in_a_standing_queue() -> None:
    """In a standing queue a waiter without a deadline is cut to ``target``; one with a
    deadline stays until the interval or until it becomes hopeless, whichever is first."""
    adm = make(limit=1, interval=0.5, target=0.0625, services=1.0)
    adm.arrive(Ticket("r", None), 0.0)
    adm.arrive(Ticket("r", None), 0.0)  # keeps the queue non-empty
    plain, timed = Ticket("r", None), Ticket("r", deadline=10.0)
    adm.arrive(plain, 0.5625)
    adm.arrive(timed, 0.5625)
    assert adm.standing(0.625)
    assert adm.give_up(plain, 0.625) is Verdict.OVERLOADED
    assert adm.give_up(timed, 0.625) is Verdict.QUEUED
    assert adm.wait_until(timed, 0.625) == 1.0625


def test_tolerance_and_services_are_validated() -> None:
    """Bad knobs are refused with the option's name."""
    for kwargs, option in (
        ({"tolerance": 1.0}, "tolerance"),
        ({"tolerance": -2}, "tolerance"),
        ({"services": 0}, "services"),
    ):
        with pytest.raises(ConfigurationError) as info:
            AdmissionConfig(**kwargs)  # type: ignore[arg-type]
        assert info.value.option == option


@pytest.mark.parametrize("rho", [2.0, 3.0])
def test_serial_handler_overloaded_keeps_goodput_near_capacity(rho: float) -> None:
    """Default admission in front of one worker at 2x and 3x its capacity (40 ms requests,
    245 ms budgets): at least 0.9 of capacity is served in time, and few admitted requests die
    inside the app. With a deadline-only signal the limit hovered where admitted requests
    queued for the worker until their deadline (0.5 of capacity in the benchmark)."""
    result = simulate(Admission(), rho)
    assert result.goodput >= 0.9
    assert result.late <= 0.2 * result.good


@pytest.mark.parametrize("workers", [4, 16])
def test_parallel_handler_overloaded_keeps_goodput_near_capacity(workers: int) -> None:
    """The same with several workers inside the app: the limit settles near their number, not
    at the minimum (one decrease per window), and goodput stays near capacity at 2x load."""
    adm = Admission()
    result = simulate(adm, 2.0, workers=workers, seconds=20.0)
    assert result.goodput >= 0.9
    assert adm.limit.value >= workers


def test_serial_handler_overloaded_deadline_only_signal_is_worse() -> None:
    """The same run with ``tolerance=None``: the old behaviour, kept measurable."""
    new = simulate(Admission(), 2.0)
    old = simulate(Admission(config=AdmissionConfig(tolerance=None)), 2.0)
    assert old.goodput < new.goodput - 0.3 and old.late > 5 * new.late


def test_serial_handler_at_half_load_sheds_nothing() -> None:
    """At half its capacity no request that could finish is turned away."""
    result = simulate(Admission(), 0.5)
    assert result.shed == 0 and result.late == 0 and result.good == result.sent


def test_a_stale_estimate_lets_one_request_through_to_refresh_it() -> None:
    """An estimate nothing has refreshed for an interval no longer shuts the route (D9.5): one
    request with budget left runs, and what it shows replaces the estimate."""
    adm = make(limit=4, interval=0.1, services=5.0)
    adm.estimates.observe("r", 0.5, now=0.0)  # learnt while the server was starved
    # Within the interval (5 x 0.5 s) the estimate stands: hopeless.
    assert adm.arrive(Ticket("r", deadline=1.25), 1.0) is Verdict.HOPELESS
    # Past it, one request is let in; the next one within the interval is not.
    probe = Ticket("r", deadline=10.25)
    assert adm.arrive(probe, 10.0) is Verdict.ADMIT
    assert adm.arrive(Ticket("r", deadline=10.26), 10.01) is Verdict.HOPELESS
    assert counters.get("admission-probes", component="http-server") == 1
    # The probe took 20 ms: the route is fast again, and requests run without probing.
    adm.release(probe, 10.02, late=False)
    assert adm.estimates.baseline("r") == pytest.approx(0.02)
    assert adm.arrive(Ticket("r", deadline=10.25), 10.03) is Verdict.ADMIT


def test_no_probe_without_a_free_slot_or_with_a_queue() -> None:
    """A probe never takes a slot a viable request needs: at the limit, hopeless is shed."""
    adm = make(limit=1, interval=0.1, services=5.0)
    adm.estimates.observe("slow", 0.5, now=0.0)
    adm.arrive(Ticket("other", None), 10.0)  # the only slot is taken
    assert adm.arrive(Ticket("slow", deadline=10.25), 10.0) is Verdict.HOPELESS
    assert counters.get("admission-probes", component="http-server") == 0


def test_no_probe_for_a_request_without_budget_or_an_estimate_given_by_hand() -> None:
    """A request whose deadline has passed is never a probe, nor one judged by an estimate set
    without a time (it does not go stale)."""
    adm = make(limit=4, interval=0.1, services=5.0)
    adm.estimates.observe("learnt", 0.5, now=0.0)
    adm.estimates.observe("given", 0.5)
    assert adm.arrive(Ticket("learnt", deadline=10.0), 10.0) is Verdict.HOPELESS
    assert adm.arrive(Ticket("given", deadline=100.25), 100.0) is Verdict.HOPELESS
    assert counters.get("admission-probes", component="http-server") == 0
