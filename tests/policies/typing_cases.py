"""Checked by mypy in test_typing.py (never run): what users' type checkers see."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Literal, assert_type

import timebound as tb
from timebound.policies import Err, Ok, Policy


def number(x: int) -> int:
    return x


async def anumber(x: int) -> int:
    return x


plain = Policy("p", retry=1)
assert_type(plain, Policy[Literal["plain"]])
assert_type(plain.execute_sync(number, (1,)), int)

wrapped = Policy("w", on_error="wrap")
assert_type(wrapped, Policy[Literal["wrap"]])
assert_type(wrapped.execute_sync(number, (1,)), Ok[int] | Err)


async def run() -> None:
    assert_type(await plain.execute(anumber, (1,)), int)
    assert_type(await plain.execute(number, (1,)), int)
    assert_type(await wrapped.execute(anumber, (1,)), Ok[int] | Err)


@tb.resilient(retry=2)
def kept(x: int) -> int:
    return x


assert_type(kept(1), int)


@tb.resilient(on_error="wrap")
def wrapped_fn(x: int) -> int:
    return x


assert_type(wrapped_fn(1), Ok[int] | Err)


@tb.resilient(on_error="wrap", timeout=1)
async def wrapped_async(x: int) -> int:
    return x


assert_type(wrapped_async(1), Awaitable[Ok[int] | Err])


def dynamic(mode: str) -> None:
    """A mode only known at run time still type-checks; the result is then Any."""
    policy = Policy("d", on_error=mode)
    policy.execute_sync(number, (1,))

    @tb.resilient(on_error=mode)
    def f(x: int) -> int:
        return x

    f(1)
