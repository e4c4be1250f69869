"""Hypothesis: a backoff schedule never exceeds its cap nor the remaining budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from timebound import DeadlineExceeded, RetryExhausted
from timebound.policies import Policy
from timebound.testing import VirtualClock

from ._helpers import Flaky, Recorder

_seconds = st.floats(min_value=0.001, max_value=100.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    delay=_seconds,
    backoff=st.sampled_from(["fixed", "linear", "exponential"]),
    max_delay=_seconds,
    jitter=st.one_of(st.just(False), st.just(True), _seconds),
    retry=st.integers(min_value=1, max_value=40),
    total=st.one_of(st.none(), _seconds),
    work=st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
)
def test_schedule_respects_cap_and_budget(
    delay: float,
    backoff: str,
    max_delay: float,
    jitter: bool | float,
    retry: int,
    total: float | None,
    work: float,
) -> None:
    """Every delay is within [base, max_delay] and ends before the total budget does."""
    policy = Policy(
        "prop",
        retry=retry,
        delay=delay,
        backoff=backoff,
        max_delay=max_delay,
        jitter=jitter,
        total_timeout=total,
    )
    rec = Recorder()
    with VirtualClock() as clock:

        def failing() -> None:
            clock.advance(work)
            raise ConnectionError

        try:
            policy.execute_sync(failing, observer=rec)
        except (RetryExhausted, DeadlineExceeded, ConnectionError):
            pass
        end = clock.now()
    for event in rec.of("retry.delay"):
        d = event.attrs["delay"]
        n = event.attrs["attempt"]
        base = {"fixed": delay, "linear": n * delay, "exponential": delay * 2.0 ** (n - 1)}[backoff]
        assert min(base, max_delay) <= d <= max_delay
        if total is not None:
            assert event.at + d < total
    if total is not None:
        # Sync attempts are cooperative: only the attempt running when the budget ends may overrun.
        assert end <= total + work
    assert len(rec.of("attempt.start")) <= retry + 1


@settings(max_examples=200, deadline=None)
@given(
    delay=_seconds,
    backoff=st.sampled_from(["fixed", "linear", "exponential"]),
    max_delay=_seconds,
    n=st.integers(min_value=1, max_value=10_000),
)
def test_delay_after_is_monotone_and_capped(
    delay: float, backoff: str, max_delay: float, n: int
) -> None:
    """Without jitter, delays never decrease from one attempt to the next and never pass the cap."""
    policy = Policy("prop", retry=1, delay=delay, backoff=backoff, max_delay=max_delay)
    assert policy.delay_after(n) <= policy.delay_after(n + 1) <= max_delay


def test_flaky_helper_counts() -> None:
    """The Flaky fake fails exactly its first N calls (sanity check for the properties)."""
    fn = Flaky(2)
    results = []
    for _ in range(3):
        try:
            results.append(fn())
        except ConnectionError:
            results.append("err")
    assert results == ["err", "err", "ok"]
