"""The `hedge` module-call option (D3.16): values, diagnostics, and a hedged call at run time."""

from __future__ import annotations

import asyncio
import threading

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.dsl import CompileError, ModuleRegistry, compile
from timebound.telemetry import Event, add_listener
from timebound.testing import VirtualClock


def _registry(latencies: list[float]) -> ModuleRegistry:
    registry = ModuleRegistry()

    @registry.module
    async def Search(query: str) -> str:
        await asyncio.sleep(latencies.pop(0) if latencies else 0.01)
        return query

    @registry.module
    def Echo(x: int) -> int:
        return x

    return registry


def _codes(source: str) -> list[tuple[str, str]]:
    with pytest.raises(CompileError) as info:
        compile(source, modules=_registry([]))
    return [(d.code, d.message) for d in info.value.diagnostics]


async def test_a_fixed_hedge_races_a_slow_call(virtual_clock: VirtualClock) -> None:
    """After 20 quick calls (the extra-load budget), a slow one is hedged at 20 ms."""
    latencies = [0.005] * 20 + [1.0, 0.01]
    program = compile(
        "in q: String\nr = Search(q) with hedge: 20ms\nout r", modules=_registry(latencies)
    )
    for _ in range(20):
        await program.run({"q": "a"})
    start = _clock.now()
    assert await program.run({"q": "a"}) == {"r": "a"}
    assert _clock.now() - start == pytest.approx(0.03)


async def test_a_percentile_hedge_learns(virtual_clock: VirtualClock) -> None:
    """hedge: p95 reaches the call site's Policy as the learned delay."""
    latencies = [0.01] * 20 + [1.0, 0.01]
    program = compile(
        "in q: String\nr = Search(q) with hedge: p95\nout r", modules=_registry(latencies)
    )
    for _ in range(20):
        await program.run({"q": "a"})
    start = _clock.now()
    await program.run({"q": "a"})
    assert _clock.now() - start == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("value", "code", "message"),
    [
        ("0ms", "E016", "Invalid value for 'hedge': 0ms (must be > 0)"),
        ("p0", "E016", "Invalid value for 'hedge': p0 (must be > 0)"),
        ("-20ms", "E016", "Invalid value for 'hedge': -20ms (must be > 0)"),
        (
            "p100",
            "E013",
            "Option 'hedge' expects a duration literal such as 20ms or a percentile p1 to p99 "
            "such as p95, found 'p100'",
        ),
        (
            "fast",
            "E013",
            "Option 'hedge' expects a duration literal such as 20ms or a percentile p1 to p99 "
            "such as p95, found 'fast'",
        ),
    ],
)
def test_bad_hedge_values_have_stable_diagnostics(value: str, code: str, message: str) -> None:
    """Zero is E016 and a value of the wrong form E013, worded as the option table says."""
    assert _codes(f"in q: String\nr = Search(q) with hedge: {value}\nout r") == [(code, message)]


def test_a_sync_module_is_hedged_in_threads() -> None:
    """A sync module with `hedge` compiles (it was E013) and races in threads (D3.14): once the
    extra-load budget allows a hedge, the hedge answers while the primary is stuck, and the
    primary is then asked to stop. Who answers is decided by events, never by timing: a primary
    waits until its hedge is suppressed (then it answers) or it is stopped."""
    lock = threading.Lock()
    stuck: list[threading.Event] = []  # the primary now waiting, if any
    stopped: list[int] = []
    registry = ModuleRegistry()

    @registry.module
    def Lookup(x: int) -> int:
        with lock:
            if stuck:
                return x * 10 + 2  # a hedge: the primary of this call is waiting
            gate = threading.Event()
            stuck.append(gate)
        try:
            while not gate.wait(0.001):
                tb.checkpoint()
            return x * 10 + 1
        except tb.DeadlineExceeded:
            stopped.append(x)
            raise
        finally:
            with lock:
                stuck.remove(gate)

    def on_event(event: Event) -> None:
        if event.name == "hedge.suppressed":
            with lock:
                stuck[0].set()  # no hedge for this call: its primary answers

    program = compile("in x: Int\ny = Lookup(x) with hedge: 1ms\nout y", modules=registry)
    remove = add_listener(on_event)
    try:
        answers = [program.run_sync({"x": 4})["y"] for _ in range(19)]
        # 5 % extra load: the 20th call earns the first hedge.
        answers.append(program.run_sync({"x": 4})["y"])
    finally:
        remove()
    for thread in threading.enumerate():
        if thread.name.startswith("timebound hedge race"):
            thread.join(10)
    assert answers == [41] * 19 + [42]
    assert stopped == [4]


def test_duplicate_hedge_is_e018() -> None:
    """The option is an ordinary one: written twice it is E018."""
    codes = _codes("in q: String\nr = Search(q) with hedge: 20ms, hedge: p95\nout r")
    assert codes == [("E018", "Duplicate option 'hedge'")]
