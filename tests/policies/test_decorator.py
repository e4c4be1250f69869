"""timebound.resilient: one decorator for sync and async functions."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import timebound as tb
from timebound import DeadlineExceeded, RetryExhausted
from timebound.policies import Policy
from timebound.testing import VirtualClock


async def test_async_function(virtual_clock: VirtualClock) -> None:
    """An async function stays a coroutine function and is retried."""
    calls = 0

    @tb.resilient(retry=2, delay="100ms")
    async def fetch(x: int) -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError
        return x * 2

    assert inspect.iscoroutinefunction(fetch)
    assert await fetch(21) == 42
    assert virtual_clock.now() == 0.2


def test_sync_function(virtual_clock: VirtualClock) -> None:
    """A sync function stays sync and is retried with sleeps on virtual time."""
    calls = 0

    @tb.resilient(retry=1, delay=3)
    def read() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError
        return "data"

    assert read() == "data"
    assert virtual_clock.now() == 3.0


def test_metadata_is_kept_and_policy_exposed() -> None:
    """The wrapper keeps name and docstring and exposes its Policy named by __qualname__."""

    @tb.resilient(retry=1)
    def documented() -> None:
        """Docs."""

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docs."
    policy = documented.policy  # type: ignore[attr-defined]
    assert isinstance(policy, Policy)
    assert policy.name.endswith("test_metadata_is_kept_and_policy_exposed.<locals>.documented")


def test_name_override() -> None:
    """name= sets the policy name (and so what it shares)."""

    @tb.resilient(name="GetUser", concurrency=2)
    def f() -> None:
        pass

    assert f.policy.name == "GetUser"  # type: ignore[attr-defined]


async def test_full_policy(virtual_clock: VirtualClock) -> None:
    """total budget + retry + attempt timeout + fallback compose as documented."""

    @tb.resilient(timeout=2, retry=5, delay=1, total_timeout=7, fallback=lambda q: f"cached {q}")
    async def search(q: str) -> str:
        await asyncio.sleep(60)
        return q

    assert await search("x") == "cached x"
    # Attempts at 0, 3, then at t=5 a 1 s delay + attempt still fits: the third is cut at 7.
    assert virtual_clock.now() == 7.0


async def test_errors_reach_the_caller_unchanged(virtual_clock: VirtualClock) -> None:
    """Without a fallback the caller sees DeadlineExceeded or RetryExhausted."""

    @tb.resilient(timeout=1)
    async def slow() -> None:
        await asyncio.sleep(5)

    @tb.resilient(retry=1)
    async def broken() -> None:
        raise ValueError

    with pytest.raises(DeadlineExceeded):
        await slow()
    with pytest.raises(RetryExhausted):
        await broken()


def test_methods_work(virtual_clock: VirtualClock) -> None:
    """Decorating a method passes self through like any argument."""

    class Client:
        def __init__(self) -> None:
            self.calls = 0

        @tb.resilient(retry=2)
        def get(self) -> int:
            self.calls += 1
            if self.calls < 2:
                raise ConnectionError
            return self.calls

    assert Client().get() == 2


def test_the_options_are_written_once_and_agree_with_policy() -> None:
    """resilient's and Policy's keywords are one TypedDict; Policy's implementation has them all."""
    from timebound.policies._options import PolicyOptions

    own = {"self", "name", "on_error", "zero"}
    policy_keywords = set(inspect.signature(Policy.__init__).parameters) - own
    assert policy_keywords == set(PolicyOptions.__optional_keys__)


def test_a_misspelt_option_is_a_type_error_naming_it() -> None:
    """An unknown keyword fails where resilient(...) is written, as a plain function's would."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'retyr'"):
        tb.resilient(retyr=3)  # type: ignore[call-overload]
