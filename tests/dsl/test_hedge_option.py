"""The `hedge` module-call option (D3.16): values, diagnostics, and a hedged call at run time."""

from __future__ import annotations

import asyncio

import pytest

from timebound._core import _clock
from timebound.dsl import CompileError, ModuleRegistry, compile
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


def test_a_sync_module_cannot_be_hedged() -> None:
    """A sync module runs to its end: hedging it is a compile error naming the module."""
    assert _codes("in x: Int\ny = Echo(x) with hedge: 20ms\nout y") == [
        (
            "E013",
            "Option 'hedge' needs an async module: 'Echo' is a sync function, and a sync call "
            "cannot be raced or cancelled",
        )
    ]


def test_duplicate_hedge_is_e018() -> None:
    """The option is an ordinary one: written twice it is E018."""
    codes = _codes("in q: String\nr = Search(q) with hedge: 20ms, hedge: p95\nout r")
    assert codes == [("E018", "Duplicate option 'hedge'")]
