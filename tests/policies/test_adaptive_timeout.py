"""Learned attempt timeouts (D3.15): a percentile of recent latencies, floored, clamped."""

from __future__ import annotations

import asyncio

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.policies import Policy
from timebound.testing import VirtualClock


class _Service:
    """Answers after the next of ``latencies`` (then ``rest``) seconds of virtual time."""

    def __init__(self, latencies: list[float], rest: float) -> None:
        self.latencies = latencies
        self.rest = rest
        self.starts: list[float] = []

    async def __call__(self) -> str:
        self.starts.append(_clock.now())
        await asyncio.sleep(self.latencies.pop(0) if self.latencies else self.rest)
        return "ok"


async def _warm(policy: Policy[object], service: _Service, n: int = 20) -> None:
    for _ in range(n):
        await policy.execute(service)


async def test_the_timeout_is_the_learned_percentile(virtual_clock: VirtualClock) -> None:
    """After 20 answers in 100 ms, p99 is 100 ms: a 5 s answer times out at 100 ms."""
    service = _Service([0.1] * 20, rest=5.0)
    policy = Policy("Price", timeout="p99", timeout_floor="10ms")
    await _warm(policy, service)
    assert policy.learned_timeout() == pytest.approx(0.1)
    start = _clock.now()
    with pytest.raises(tb.DeadlineExceeded) as info:
        await policy.execute(service)
    assert info.value.source == "attempt" and _clock.now() - start == pytest.approx(0.1)


async def test_never_below_the_floor(virtual_clock: VirtualClock) -> None:
    """Answers in 1 ms with a 50 ms floor: the attempt gets 50 ms."""
    service = _Service([0.001] * 20, rest=5.0)
    policy = Policy("Price", timeout="p99", timeout_floor="50ms")
    await _warm(policy, service)
    assert policy.learned_timeout() == 0.05


async def test_clamped_by_what_the_caller_has_left(virtual_clock: VirtualClock) -> None:
    """A learned 1 s under a caller with 200 ms left: the caller's bound fires at 200 ms."""
    service = _Service([1.0] * 20, rest=5.0)
    policy = Policy("Price", timeout="p99", timeout_floor="10ms")
    await _warm(policy, service)
    start = _clock.now()
    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.2):
        await policy.execute(service)
    assert info.value.source == "scope" and _clock.now() - start == pytest.approx(0.2)


async def test_unbounded_until_learned(virtual_clock: VirtualClock) -> None:
    """Before 20 latencies are known the attempt has no timeout of its own."""
    service = _Service([3.0], rest=0.1)
    policy = Policy("Price", timeout="p99", timeout_floor="10ms")
    assert policy.learned_timeout() is None
    assert await policy.execute(service) == "ok" and _clock.now() == 3.0


def test_sync_calls_learn_too(virtual_clock: VirtualClock) -> None:
    """A sync call's latencies feed the window; a late result is an attempt timeout."""
    policy = Policy("Price", timeout="p90", timeout_floor="10ms")
    for _ in range(20):
        policy.execute_sync(_clock.sleep, (0.2,))
    assert policy.learned_timeout() == pytest.approx(0.2)
    with pytest.raises(tb.DeadlineExceeded) as info:
        policy.execute_sync(_clock.sleep, (1.0,))
    assert info.value.source == "attempt"


@pytest.mark.parametrize(
    ("kwargs", "option", "match"),
    [
        ({"timeout": "p99"}, "timeout_floor", "needs a floor"),
        ({"timeout": "1s", "timeout_floor": "10ms"}, "timeout_floor", "learned timeout"),
        ({"timeout": "p100", "timeout_floor": "10ms"}, "timeout", "percentile"),
        ({"timeout": "p99", "timeout_floor": 0}, "timeout_floor", "timeout_floor"),
    ],
)
def test_bad_learned_timeouts_name_the_option(
    kwargs: dict[str, object], option: str, match: str
) -> None:
    """Each bad combination is a ConfigurationError naming the option."""
    with pytest.raises(tb.ConfigurationError, match=match) as info:
        Policy("Price", **kwargs)  # type: ignore[arg-type]
    assert info.value.option == option
