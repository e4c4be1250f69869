"""Retry budgets (D3.12): retries as a share of calls over a window, shared only by an object."""

from __future__ import annotations

import pytest

import timebound as tb
from timebound.lowlevel import RetryAt, RetryPlan, Stop
from timebound.policies import Policy, RetryBudget
from timebound.testing import VirtualClock

from ._helpers import Flaky, Recorder


class _Down:
    """A dependency that fails every call; counts what reaches it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        raise ConnectionError("down")


def test_the_budget_caps_retries_at_its_share_of_calls(virtual_clock: VirtualClock) -> None:
    """100 calls with retry=3 against a dead dependency: 100 + 20 attempts, not 400."""
    down = _Down()
    policy = Policy("Get", retry=3, retry_budget=RetryBudget(0.2, min_per_second=0))
    for _ in range(100):
        with pytest.raises((ConnectionError, tb.RetryExhausted)):
            policy.execute_sync(down)
    assert down.calls == 120


def test_without_a_budget_every_retry_is_made(virtual_clock: VirtualClock) -> None:
    """The baseline: retry=3 means 4 attempts per failing call."""
    down = _Down()
    policy = Policy("Get", retry=3)
    for _ in range(10):
        with pytest.raises(tb.RetryExhausted):
            policy.execute_sync(down)
    assert down.calls == 40


def test_a_refused_retry_ends_with_the_error_and_an_event(virtual_clock: VirtualClock) -> None:
    """The call ends with the attempt's own error, noted, and a retry.refused event."""
    policy = Policy("Get", retry=3, retry_budget=RetryBudget(0.0, min_per_second=0))
    recorder = Recorder()
    with pytest.raises(ConnectionError) as info:
        policy.execute_sync(Flaky(5), observer=recorder)
    assert any("retry budget is spent" in note for note in info.value.__notes__)
    assert [e.attrs["reason"] for e in recorder.of("retry.refused")] == ["retry_budget_exhausted"]


def test_the_minimum_allows_retries_when_calls_are_few(virtual_clock: VirtualClock) -> None:
    """min_per_second * window retries are allowed whatever the ratio."""
    budget = RetryBudget(0.0, min_per_second=0.5, window="4s")  # 2 retries per 4 s
    plan = RetryPlan("Get", retry=1, budget=budget)
    decisions = [plan.failed(plan.start(), ConnectionError())[1] for _ in range(3)]
    assert [type(d) for d in decisions] == [RetryAt, RetryAt, Stop]


def test_the_window_slides(virtual_clock: VirtualClock) -> None:
    """Retries spent more than a window ago are forgotten."""
    budget = RetryBudget(0.0, min_per_second=0.25, window="4s")  # one retry per 4 s
    assert budget.try_withdraw() and not budget.try_withdraw()
    virtual_clock.advance(4.5)
    assert budget.try_withdraw()


def test_one_budget_object_is_shared_by_the_policies_given_it(
    virtual_clock: VirtualClock,
) -> None:
    """Two policies passing the same object draw on one budget; a third has its own."""
    shared = RetryBudget(0.0, min_per_second=0.1, window="10s")  # one retry in all
    a = Policy("A", retry=1, retry_budget=shared)
    b = Policy("B", retry=1, retry_budget=shared)
    c = Policy("A", retry=1, retry_budget=RetryBudget(0.0, min_per_second=0.1, window="10s"))
    assert a.execute_sync(Flaky(1)) == "ok"
    with pytest.raises(ConnectionError):
        b.execute_sync(Flaky(1))
    assert c.execute_sync(Flaky(1)) == "ok"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"ratio": -1}, "retry_budget.ratio"),
        ({"ratio": True}, "retry_budget.ratio"),
        ({"min_per_second": float("inf")}, "retry_budget.min_per_second"),
        ({"window": 0}, "retry_budget.window"),
        ({"window": "forever"}, "retry_budget.window"),
    ],
)
def test_bad_budgets_name_the_field(kwargs: dict[str, object], option: str) -> None:
    """Each bad value is a ConfigurationError naming the field."""
    with pytest.raises(tb.ConfigurationError) as info:
        RetryBudget(**kwargs)  # type: ignore[arg-type]
    assert info.value.option == option


def test_retry_budget_must_be_an_object() -> None:
    """A number is refused with the spelling to use."""
    with pytest.raises(tb.ConfigurationError, match="RetryBudget") as info:
        Policy("Get", retry=1, retry_budget=0.2)  # type: ignore[arg-type]
    assert info.value.option == "retry_budget"
