"""A compiled Constellation program owns its caches and limiters (D3.6, D3.7)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from timebound.dsl import CompileError, ModuleRegistry, compile
from timebound.policies import InMemoryCache
from timebound.testing import VirtualClock


def _lookup(answer: str, calls: list[str]) -> Callable[..., object]:
    async def Lookup(key: str) -> str:
        calls.append(answer)
        await asyncio.sleep(1)
        return answer

    return Lookup


SOURCE = "in k: String\nv = Lookup(k) with cache: 1min\nout v"


async def test_two_registries_with_one_module_name_keep_their_own_entries(
    virtual_clock: VirtualClock,
) -> None:
    """Two registries each registering a different Lookup never read each other's cache."""
    calls: list[str] = []
    first, second = ModuleRegistry(), ModuleRegistry()
    first.register("Lookup", _lookup("first", calls))
    second.register("Lookup", _lookup("second", calls))
    a = compile(SOURCE, modules=first)
    b = compile(SOURCE, modules=second)
    assert await a.run({"k": "x"}) == {"v": "first"}
    assert await b.run({"k": "x"}) == {"v": "second"}
    assert calls == ["first", "second"]


async def test_two_programs_from_one_registry_own_separate_caches(
    virtual_clock: VirtualClock,
) -> None:
    """Each compiled program has its own cache; inside one program entries are reused."""
    calls: list[str] = []
    registry = ModuleRegistry()
    registry.register("Lookup", _lookup("v", calls))
    a = compile(SOURCE, modules=registry)
    b = compile(SOURCE, modules=registry)
    await a.run({"k": "x"})
    await a.run({"k": "x"})
    await b.run({"k": "x"})
    assert calls == ["v", "v"]


async def test_memory_names_the_programs_own_cache(virtual_clock: VirtualClock) -> None:
    """cache_backend: "memory" is the built-in backend, needing no registration."""
    calls: list[str] = []
    registry = ModuleRegistry()
    registry.register("Lookup", _lookup("v", calls))
    program = compile(
        'in k: String\nv = Lookup(k) with cache: 1min, cache_backend: "memory"\nout v',
        modules=registry,
    )
    await program.run({"k": "x"})
    await program.run({"k": "x"})
    assert calls == ["v"]


async def test_a_backend_registered_on_the_registry_is_shared_on_purpose(
    virtual_clock: VirtualClock,
) -> None:
    """Programs that name a backend registered on their registry share its entries."""
    calls: list[str] = []
    registry = ModuleRegistry()
    registry.register("Lookup", _lookup("v", calls))
    registry.register_cache_backend("shared", InMemoryCache())
    source = 'in k: String\nv = Lookup(k) with cache: 1min, cache_backend: "shared"\nout v'
    await compile(source, modules=registry).run({"k": "x"})
    await compile(source, modules=registry).run({"k": "x"})
    assert calls == ["v"]


def test_an_unregistered_backend_is_a_compile_error() -> None:
    """A backend name the registry does not know fails to compile, listing the known ones."""
    registry = ModuleRegistry()
    registry.register("Lookup", _lookup("v", []))
    with pytest.raises(CompileError, match=r"unknown cache_backend 'redis'.*'memory'"):
        compile(
            'in k: String\nv = Lookup(k) with cache: 1min, cache_backend: "redis"\nout v',
            modules=registry,
        )


def test_memory_cannot_be_registered() -> None:
    """ "memory" is built in; registering it is refused."""
    from timebound import ConfigurationError

    with pytest.raises(ConfigurationError, match="built-in"):
        ModuleRegistry().register_cache_backend("memory", InMemoryCache())


async def test_concurrency_is_per_program(virtual_clock: VirtualClock) -> None:
    """Two programs with concurrency: 1 on one module run their calls side by side."""
    starts: list[float] = []

    async def Work(x: int) -> int:
        starts.append(virtual_clock.now())
        await asyncio.sleep(1)
        return x

    registry = ModuleRegistry()
    registry.register("Work", Work)
    source = "in x: Int\ny = Work(x) with concurrency: 1\nout y"
    a, b = compile(source, modules=registry), compile(source, modules=registry)
    await asyncio.gather(a.run({"x": 1}), b.run({"x": 2}))
    assert starts == [0.0, 0.0]


async def test_call_sites_of_one_program_share_the_modules_slots(
    virtual_clock: VirtualClock,
) -> None:
    """Inside one program every call site of a module draws from one set of slots."""
    starts: list[float] = []

    async def Work(x: int) -> int:
        starts.append(virtual_clock.now())
        await asyncio.sleep(1)
        return x

    registry = ModuleRegistry()
    registry.register("Work", Work)
    program = compile(
        "in x: Int\na = Work(x) with concurrency: 1\nb = Work(x + 1) with concurrency: 1\n"
        "out a\nout b",
        modules=registry,
    )
    await program.run({"x": 1})
    assert starts == [0.0, 1.0]


async def test_call_sites_of_one_module_coalesce_identical_calls(
    virtual_clock: VirtualClock,
) -> None:
    """Two call sites of a cached module with the same input, running together, make one call:
    they share the program's cache and its calls in flight."""
    calls: list[str] = []
    registry = ModuleRegistry()
    registry.register("Lookup", _lookup("v", calls))
    program = compile(
        "in k: String\na = Lookup(k) with cache: 1min\nb = Lookup(k) with cache: 1min\n"
        "out a\nout b",
        modules=registry,
    )
    assert await program.run({"k": "x"}) == {"a": "v", "b": "v"}
    assert calls == ["v"]
    assert virtual_clock.now() == 1.0
