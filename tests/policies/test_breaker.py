"""Circuit breakers (D3.13): failure and slow-call rates, probes, the caller's deadline."""

from __future__ import annotations

import asyncio
import pickle

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.policies import CircuitBreaker, Policy
from timebound.testing import VirtualClock

from ._helpers import Recorder


class _Dependency:
    """Fails while ``down``; takes ``seconds`` of virtual time; counts the calls it receives."""

    def __init__(self, *, down: bool = True, seconds: float = 0.0) -> None:
        self.down = down
        self.seconds = seconds
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.seconds:
            await asyncio.sleep(self.seconds)
        if self.down:
            raise ConnectionError("down")
        return "ok"


async def _run(policy: Policy[object], fn: _Dependency, n: int) -> list[BaseException | str]:
    out: list[BaseException | str] = []
    for _ in range(n):
        try:
            out.append(await policy.execute(fn))
        except Exception as exc:
            out.append(exc)
    return out


async def test_failures_open_the_breaker_and_it_fails_fast(virtual_clock: VirtualClock) -> None:
    """5 of 5 failed: the sixth call never reaches the dependency and says when it probes."""
    dep = _Dependency()
    breaker = CircuitBreaker(min_calls=5, break_for="10s")
    policy = Policy("Stock", breaker=breaker)
    results = await _run(policy, dep, 7)
    assert dep.calls == 5 and breaker.state == "open"
    err = results[-1]
    assert isinstance(err, tb.CircuitOpen) and isinstance(err, tb.TimeboundError)
    assert err.code == "circuit-open" and err.retry_after == 10.0
    assert "5 of 5 attempts failed" in str(err) and "probes again in 10s" in str(err)


async def test_below_min_calls_nothing_opens(virtual_clock: VirtualClock) -> None:
    """Minimum throughput: 4 failures with min_calls 5 keep it closed."""
    breaker = CircuitBreaker(min_calls=5)
    await _run(Policy("Stock", breaker=breaker), _Dependency(), 4)
    assert breaker.state == "closed"


async def test_a_successful_probe_closes_it(virtual_clock: VirtualClock) -> None:
    """After break_for one probe goes through; its success closes the breaker."""
    dep = _Dependency()
    breaker = CircuitBreaker(min_calls=2, break_for="5s")
    policy = Policy("Stock", breaker=breaker)
    await _run(policy, dep, 2)
    assert breaker.state == "open"
    virtual_clock.advance(5)
    assert breaker.state == "half_open"
    dep.down = False
    assert await policy.execute(dep) == "ok"
    assert breaker.state == "closed" and dep.calls == 3


async def test_a_failed_probe_opens_it_again(virtual_clock: VirtualClock) -> None:
    """A probe that fails starts a new break."""
    dep = _Dependency()
    breaker = CircuitBreaker(min_calls=2, break_for="5s")
    policy = Policy("Stock", breaker=breaker)
    await _run(policy, dep, 2)
    virtual_clock.advance(5)
    await _run(policy, dep, 1)
    assert breaker.state == "open" and dep.calls == 3
    (err,) = await _run(policy, dep, 1)
    assert isinstance(err, tb.CircuitOpen) and err.retry_after == 5.0


async def test_only_the_probes_go_through_while_half_open(virtual_clock: VirtualClock) -> None:
    """With one probe in flight, a concurrent attempt fails fast."""
    dep = _Dependency(seconds=1.0)
    breaker = CircuitBreaker(min_calls=1, break_for="5s")
    policy = Policy("Stock", breaker=breaker)
    await _run(policy, dep, 1)
    virtual_clock.advance(5)
    dep.down = False
    results = await asyncio.gather(policy.execute(dep), policy.execute(dep), return_exceptions=True)
    assert results[0] == "ok" and isinstance(results[1], tb.CircuitOpen)
    assert breaker.state == "closed"


async def test_the_callers_deadline_never_opens_it(virtual_clock: VirtualClock) -> None:
    """Ten calls cut by the caller's own 1 s deadline count nothing against the dependency."""
    dep = _Dependency(down=False, seconds=60.0)
    breaker = CircuitBreaker(min_calls=3)
    policy = Policy("Stock", timeout="5s", breaker=breaker)
    for _ in range(10):
        with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(1):
            await policy.execute(dep)
        assert info.value.source == "scope"
    assert breaker.state == "closed" and dep.calls == 10


async def test_the_attempts_own_timeout_counts(virtual_clock: VirtualClock) -> None:
    """An attempt that runs out of its own timeout is the dependency's failure."""
    dep = _Dependency(down=False, seconds=60.0)
    breaker = CircuitBreaker(min_calls=3)
    policy = Policy("Stock", timeout="500ms", breaker=breaker)
    results = await _run(policy, dep, 4)
    assert [type(r) for r in results] == [tb.DeadlineExceeded] * 3 + [tb.CircuitOpen]
    assert breaker.state == "open"


async def test_slow_calls_open_it(virtual_clock: VirtualClock) -> None:
    """Successful but slow: 3 of 3 calls over slow_call with slow_ratio 0.8 open it."""
    dep = _Dependency(down=False, seconds=2.0)
    breaker = CircuitBreaker(min_calls=3, slow_call="1s", slow_ratio=0.8)
    results = await _run(Policy("Stock", breaker=breaker), dep, 4)
    assert results[:3] == ["ok"] * 3 and isinstance(results[3], tb.CircuitOpen)
    assert "took 1s or more" in str(results[3])


async def test_a_retry_waits_for_the_probe(virtual_clock: VirtualClock) -> None:
    """CircuitOpen carries retry_after: a retry is scheduled at the probe time (D3.11)."""
    dep = _Dependency()
    breaker = CircuitBreaker(min_calls=2, break_for="3s")
    policy = Policy("Stock", retry=3, delay="100ms", breaker=breaker)
    await _run(Policy("Warm", breaker=breaker), dep, 2)  # opened by another policy sharing it
    dep.down = False
    assert await policy.execute(dep) == "ok"
    assert _clock.now() == 3.0 and breaker.state == "closed"


async def test_a_probe_past_the_deadline_stops_retrying(virtual_clock: VirtualClock) -> None:
    """An open breaker that probes after the caller's deadline: no retry, the reason said."""
    dep = _Dependency()
    breaker = CircuitBreaker(min_calls=1, break_for="30s")
    policy = Policy("Stock", retry=3, breaker=breaker)
    await _run(Policy("Warm", breaker=breaker), dep, 1)
    recorder = Recorder()
    with pytest.raises(tb.CircuitOpen), tb.fail_after(2):
        await policy.execute(dep, observer=recorder)
    assert [e.attrs["reason"] for e in recorder.of("retry.refused")] == [
        "retry_after_past_deadline"
    ]
    assert _clock.now() == 0.0


def test_sync_calls_late_by_the_callers_deadline_are_not_counted(
    virtual_clock: VirtualClock,
) -> None:
    """Sync: a result late for the enclosing deadline is not the dependency's failure."""
    breaker = CircuitBreaker(min_calls=2)
    policy = Policy("Stock", timeout="5s", breaker=breaker)

    def slow() -> str:
        _clock.sleep(2)
        return "late"

    for _ in range(3):
        with pytest.raises(tb.DeadlineExceeded), tb.fail_after(1):
            policy.execute_sync(slow)
    assert breaker.state == "closed"
    for _ in range(2):
        with pytest.raises(ConnectionError):
            policy.execute_sync(_raise)
    assert breaker.state == "open"


def _raise() -> None:
    raise ConnectionError("down")


def test_circuit_open_pickles() -> None:
    """The error survives pickling with its fields and code."""
    err = tb.CircuitOpen("Stock: circuit open", what="Stock", retry_after=2.5)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.what, back.retry_after, back.code) == (
        str(err),
        "Stock",
        2.5,
        "circuit-open",
    )


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"failure_ratio": 0}, "breaker.failure_ratio"),
        ({"slow_ratio": 1.5}, "breaker.slow_ratio"),
        ({"min_calls": 0}, "breaker.min_calls"),
        ({"window": "never"}, "breaker.window"),
        ({"break_for": float("inf")}, "breaker.break_for"),
        ({"probes": True}, "breaker.probes"),
        ({"slow_call": -1}, "breaker.slow_call"),
    ],
)
def test_bad_breakers_name_the_field(kwargs: dict[str, object], option: str) -> None:
    """Each bad knob is a ConfigurationError naming it."""
    with pytest.raises(tb.ConfigurationError) as info:
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]
    assert info.value.option == option


def test_breaker_must_be_an_object() -> None:
    """breaker=True is refused with the spelling to use."""
    with pytest.raises(tb.ConfigurationError, match="CircuitBreaker") as info:
        Policy("Stock", breaker=True)  # type: ignore[arg-type]
    assert info.value.option == "breaker"


def test_trio_breaker_opens_and_fails_fast() -> None:
    """Under trio the breaker counts failures and fails fast once open."""
    trio = pytest.importorskip("trio")
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        await trio.sleep(0.01)
        raise ConnectionError("down")

    async def main() -> list[str]:
        policy = Policy("Stock", breaker=CircuitBreaker(min_calls=3, break_for="5s"))
        seen = []
        for _ in range(5):
            try:
                await policy.execute(down)
            except Exception as exc:
                seen.append(type(exc).__name__)
        return seen

    clock = VirtualClock()
    with clock:
        seen = trio.run(main, clock=clock.trio_clock())
    assert seen == ["ConnectionError"] * 3 + ["CircuitOpen"] * 2 and calls == 3
