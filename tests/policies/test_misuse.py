"""Misuse of resilient gets a message that says what to write."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import timebound as tb
from timebound.policies import Policy


def test_resilient_without_parentheses_says_what_to_write() -> None:
    """@resilient (no call) names the function and the spelling that works."""

    def fetch() -> int:
        return 1

    with pytest.raises(tb.ConfigurationError, match=r"write @resilient\(\) .* above") as info:
        tb.resilient(fetch)  # type: ignore[call-overload]
    assert "fetch" in str(info.value)


def test_resilient_applied_to_a_non_callable_says_what_it_got() -> None:
    """resilient(...)(42) says it decorates functions and names what it got."""
    with pytest.raises(tb.ConfigurationError, match="decorates a function, got int 42"):
        tb.resilient(retry=1)(42)  # type: ignore[type-var]


def test_generator_functions_are_refused() -> None:
    """A generator function cannot be retried: ConfigurationError at decoration time."""

    def numbers() -> Iterator[int]:
        yield 1

    with pytest.raises(tb.ConfigurationError, match="generator function"):
        tb.resilient(retry=1)(numbers)


def test_async_generator_functions_are_refused() -> None:
    """Likewise an async generator function."""

    async def numbers() -> AsyncIterator[int]:
        yield 1

    with pytest.raises(tb.ConfigurationError, match="async generator function"):
        tb.resilient(retry=1)(numbers)


@pytest.mark.parametrize(
    "call",
    [
        lambda: tb.resilient(retry=-1),
        lambda: tb.resilient(on_error="explode"),  # type: ignore[call-overload]
        lambda: Policy("p", cache="1min", cache_backend=object()),  # type: ignore[call-overload]
        lambda: Policy("p", concurrency=0),
        lambda: Policy("p", throttle="fast"),
        lambda: Policy("p", cache="1min", cache_key=42),  # type: ignore[call-overload]
    ],
)
def test_no_private_names_in_configuration_errors(call: Any) -> None:
    """User-facing errors name options and public types, never a private class."""
    with pytest.raises(tb.ConfigurationError) as info:
        call()
    assert "._" not in str(info.value) and " _" not in str(info.value)


def test_an_async_callable_run_synchronously_is_a_plain_type_error() -> None:
    """execute_sync on a coroutine function: a TypeError saying to await execute()."""

    async def work() -> int:
        return 1

    with pytest.raises(TypeError, match=r"await Policy.execute\(\)") as info:
        Policy("p", retry=3, on_error="skip").execute_sync(work)
    assert type(info.value) is TypeError
