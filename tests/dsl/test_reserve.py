"""The ``reserve`` call option (D1.18): the module's attempts see the deadline less the reserve,
and the fallback answers in the time kept back."""

from __future__ import annotations

import asyncio

import pytest

import timebound as tb
from timebound.dsl import CompileError, ModuleRegistry, compile
from timebound.testing import VirtualClock


def _registry() -> ModuleRegistry:
    registry = ModuleRegistry()

    @registry.module
    async def Lookup(key: str) -> str:
        await asyncio.sleep(60)
        return f"fresh {key}"

    return registry


async def test_the_fallback_answers_in_the_reserve(virtual_clock: VirtualClock) -> None:
    program = compile(
        'in k: String\nv = Lookup(k) with reserve: 200ms, fallback: "cached"\nout v',
        modules=_registry(),
    )
    start = virtual_clock.now()
    async with tb.fail_after(1):
        assert await program.run({"k": "a"}) == {"v": "cached"}
    assert virtual_clock.now() - start == pytest.approx(0.8)


async def test_without_the_reserve_the_deadline_is_spent(virtual_clock: VirtualClock) -> None:
    program = compile(
        'in k: String\nv = Lookup(k) with fallback: "cached"\nout v', modules=_registry()
    )
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(1):
            await program.run({"k": "a"})


def test_a_zero_reserve_is_refused_at_compile_time() -> None:
    with pytest.raises(CompileError, match="reserve"):
        compile("in k: String\nv = Lookup(k) with reserve: 0ms\nout v", modules=_registry())
