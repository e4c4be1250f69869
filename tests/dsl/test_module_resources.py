"""A module's breaker and retry budget (D3.16): given by the host that registers it, shared by
every call site of every program compiled against the registry, and by nothing else."""

from __future__ import annotations

import pytest

import timebound as tb
from timebound.dsl import ModuleRegistry, compile
from timebound.policies import CircuitBreaker, RetryBudget
from timebound.testing import VirtualClock


class _Down:
    """A dependency that fails every call; counts them."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        raise ConnectionError("down")


def _registry(down: _Down, **resources: object) -> ModuleRegistry:
    registry = ModuleRegistry()

    async def Fetch(x: int) -> int:
        return down(x)

    registry.register("Fetch", Fetch, **resources)  # type: ignore[arg-type]
    return registry


async def test_every_call_site_shares_the_modules_breaker(virtual_clock: VirtualClock) -> None:
    """Failures at one call site (with options) open the module's breaker; a call site without
    any option, in another program, then fails fast without calling the dependency."""
    down = _Down()
    breaker = CircuitBreaker(min_calls=2, break_for="10s")
    registry = _registry(down, breaker=breaker)
    retrying = compile("in x: Int\ny = Fetch(x) with retry: 1\nout y", modules=registry)
    plain = compile("in x: Int\ny = Fetch(x)\nout y", modules=registry)
    with pytest.raises(tb.RetryExhausted):
        await retrying.run({"x": 1})
    assert down.calls == 2 and breaker.state == "open"
    with pytest.raises(tb.CircuitOpen):
        await plain.run({"x": 1})
    assert down.calls == 2


async def test_the_modules_retry_budget_bounds_every_call_sites_retries(
    virtual_clock: VirtualClock,
) -> None:
    """A spent budget refuses the retry a call site asks for: one attempt, the module's error."""
    down = _Down()
    registry = _registry(down, retry_budget=RetryBudget(0.0, min_per_second=0))
    program = compile("in x: Int\ny = Fetch(x) with retry: 3\nout y", modules=registry)
    with pytest.raises(ConnectionError):
        await program.run({"x": 1})
    assert down.calls == 1


async def test_a_module_without_them_is_unaffected(virtual_clock: VirtualClock) -> None:
    """Another module registered without a breaker keeps retrying as its options say, even when
    the first one's breaker is open: sharing is by the object given, never by the registry."""
    down, other = _Down(), _Down()
    breaker = CircuitBreaker(min_calls=1, break_for="10s")
    registry = _registry(down, breaker=breaker)

    async def Other(x: int) -> int:
        return other(x)

    registry.register("Other", Other)
    with pytest.raises(ConnectionError):
        await compile("in x: Int\ny = Fetch(x)\nout y", modules=registry).run({"x": 1})
    assert breaker.state == "open"
    with pytest.raises(tb.RetryExhausted):
        await compile("in x: Int\ny = Other(x) with retry: 2\nout y", modules=registry).run(
            {"x": 1}
        )
    assert other.calls == 3


def test_the_decorator_takes_them_too() -> None:
    """``@registry.module(breaker=..., retry_budget=...)`` registers them with the module."""
    registry = ModuleRegistry()
    breaker, budget = CircuitBreaker(), RetryBudget()

    @registry.module(breaker=breaker, retry_budget=budget)
    def Echo(x: int) -> int:
        return x

    spec = registry.get("Echo")
    assert spec is not None and spec.breaker is breaker and spec.retry_budget is budget


@pytest.mark.parametrize(
    ("resources", "option"),
    [({"breaker": "default"}, "breaker"), ({"retry_budget": 0.2}, "retry_budget")],
)
def test_anything_else_is_refused_naming_the_option(
    resources: dict[str, object], option: str
) -> None:
    """A breaker or budget that is not the object is a ConfigurationError naming the option,
    and the module is not registered."""
    registry = ModuleRegistry()
    with pytest.raises(tb.ConfigurationError) as info:
        registry.register("Echo", lambda x: x, **resources)  # type: ignore[arg-type]
    assert info.value.option == option and "Echo" not in registry
