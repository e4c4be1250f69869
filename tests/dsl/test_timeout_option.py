"""A learned attempt timeout in Constellation, `timeout: p99, timeout_floor: 50ms` (D3.16 and
D3.15): values, IR, diagnostics, and a call cut at the learned timeout at run time."""

from __future__ import annotations

import asyncio

import pytest

from timebound._core import _clock
from timebound.dsl import CallOptions, CompileError, ModuleRegistry, compile
from timebound.dsl._calls import policy_keywords
from timebound.testing import VirtualClock


def _registry(latencies: list[float], starts: list[float]) -> ModuleRegistry:
    registry = ModuleRegistry()

    @registry.module
    async def Search(query: str) -> str:
        starts.append(_clock.now())
        await asyncio.sleep(latencies.pop(0) if latencies else 0.01)
        return query

    return registry


def _codes(source: str) -> list[tuple[str, str, int, int]]:
    with pytest.raises(CompileError) as info:
        compile(source, modules=_registry([], []))
    return [(d.code, d.message, d.line, d.column) for d in info.value.diagnostics]


def test_a_percentile_timeout_reaches_the_ir_and_the_policy() -> None:
    """The percentile stays text, the floor is seconds; the Policy gets both keywords."""
    registry = _registry([], [])
    program = compile(
        "in q: String\nr = Search(q) with timeout: p99, timeout_floor: 50ms, retry: 1\nout r",
        modules=registry,
    )
    node = program.ir.call("r")
    assert node.options == CallOptions(
        declared=frozenset({"timeout", "timeout_floor", "retry"}),
        timeout="p99",
        timeout_floor=0.05,
        retry=1,
    )
    spec = registry.get("Search")
    assert spec is not None
    kwargs = policy_keywords(node, spec)
    assert kwargs is not None
    assert (kwargs["timeout"], kwargs["timeout_floor"]) == ("p99", 0.05)


def test_a_fixed_timeout_is_unchanged() -> None:
    """A duration is seconds, as before the percentile form."""
    program = compile(
        "in q: String\nr = Search(q) with timeout: 2s\nout r", modules=_registry([], [])
    )
    assert program.ir.call("r").options.timeout == 2.0


async def test_a_slow_call_is_cut_at_the_learned_timeout(virtual_clock: VirtualClock) -> None:
    """After 20 answers in 80 ms, p99 is 80 ms (above the 50 ms floor): a 5 s answer is cut at
    80 ms and retried, and the retry answers in 10 ms."""
    starts: list[float] = []
    latencies = [0.08] * 20 + [5.0, 0.01]
    program = compile(
        "in q: String\nr = Search(q) with timeout: p99, timeout_floor: 50ms, retry: 1\nout r",
        modules=_registry(latencies, starts),
    )
    for _ in range(20):
        await program.run({"q": "a"})
    start = _clock.now()
    assert await program.run({"q": "a"}) == {"r": "a"}
    assert [t - start for t in starts[20:]] == [0, pytest.approx(0.08)]
    assert _clock.now() - start == pytest.approx(0.09)


async def test_never_cut_before_the_floor(virtual_clock: VirtualClock) -> None:
    """After 20 answers in 1 ms the learned p99 is 1 ms, but the attempt gets the 50 ms floor:
    a 30 ms answer is not cut, a 5 s one is cut at 50 ms."""
    starts: list[float] = []
    latencies = [0.001] * 20 + [0.03, 5.0, 0.01]
    program = compile(
        "in q: String\nr = Search(q) with timeout: p99, timeout_floor: 50ms, retry: 1\nout r",
        modules=_registry(latencies, starts),
    )
    for _ in range(20):
        await program.run({"q": "a"})
    start = _clock.now()
    await program.run({"q": "a"})
    assert _clock.now() - start == pytest.approx(0.03)
    assert len(starts) == 21  # not retried
    start = _clock.now()
    await program.run({"q": "a"})
    assert [t - start for t in starts[21:]] == [0, pytest.approx(0.05)]


async def test_each_call_site_learns_its_own(virtual_clock: VirtualClock) -> None:
    """Two call sites of one module: the one that saw only slow answers has not learned a
    short timeout from the other."""
    starts: list[float] = []
    latencies = [0.08] * 20 + [0.5] * 20 + [0.4, 0.4]
    program = compile(
        "in q: String\nin slow: Boolean\n"
        "r = if (slow) Search(q) with timeout: p99, timeout_floor: 50ms\n"
        "    else Search(q) with timeout: p99, timeout_floor: 50ms\nout r",
        modules=_registry(latencies, starts),
    )
    for _ in range(20):
        await program.run({"q": "a", "slow": False})
    for _ in range(20):
        await program.run({"q": "a", "slow": True})
    start = _clock.now()
    assert await program.run({"q": "a", "slow": True}) == {"r": "a"}
    assert _clock.now() - start == pytest.approx(0.4)  # p99 0.5 s here, not the other's 80 ms


@pytest.mark.parametrize(
    ("options", "diagnostic"),
    [
        (
            "timeout: p0, timeout_floor: 50ms",
            ("E016", "Invalid value for 'timeout': p0 (must be > 0)", 2, 29),
        ),
        (
            "timeout: p99",
            (
                "E013",
                "A learned timeout needs a floor: write 'timeout: p99, timeout_floor: 50ms'",
                2,
                29,
            ),
        ),
        (
            "timeout: 2s, timeout_floor: 50ms",
            (
                "E013",
                "'timeout_floor' applies to a learned timeout (a percentile such as p99) only; "
                "this call has a fixed timeout",
                2,
                33,
            ),
        ),
        (
            "retry: 1, timeout_floor: 50ms",
            (
                "E013",
                "'timeout_floor' applies to a learned timeout (a percentile such as p99) only; "
                "this call has no timeout",
                2,
                30,
            ),
        ),
        (
            "timeout: p99, timeout_floor: 0ms",
            ("E016", "Invalid value for 'timeout_floor': 0ms (must be > 0)", 2, 49),
        ),
        (
            "timeout: p100, timeout_floor: 50ms",
            (
                "E013",
                "Option 'timeout' expects a duration literal such as 250ms, 5s, 2min, 1h or 1d, "
                "or a percentile p1 to p99 such as p99, found 'p100'",
                2,
                29,
            ),
        ),
    ],
)
def test_bad_learned_timeouts_have_stable_diagnostics(
    options: str, diagnostic: tuple[str, str, int, int]
) -> None:
    """One diagnostic each, worded and placed as the other options' (D3.9)."""
    assert _codes(f"in q: String\nr = Search(q) with {options}\nout r") == [diagnostic]
