"""on_error (D3.5): propagate, skip, log, wrap; zero values from the return annotation."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple, Optional, TypedDict

import pytest

import timebound as tb
from timebound import Deadline, DeadlineExceeded, RetryExhausted, fail_after, inherit_deadline
from timebound._core import _clock
from timebound.policies import Err, Ok, Policy, zero_value_for
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky, Hang


@dataclasses.dataclass
class Address:
    street: str
    number: int


@dataclasses.dataclass
class User:
    name: str
    age: int
    score: float
    active: bool
    tags: list[str]
    extra: dict[str, int]
    nickname: Optional[str]  # noqa: UP045 - the typing spelling is what users write too
    address: Address


class Movie(TypedDict):
    title: str
    year: int
    genres: list[str]


class Point(NamedTuple):
    x: float
    y: float


@pytest.mark.parametrize(
    ("annotation", "zero"),
    [
        (str, ""),
        (int, 0),
        (float, 0.0),
        (bool, False),
        (list, []),
        (list[int], []),
        (dict, {}),
        (dict[str, int], {}),
        (Optional[int], None),  # noqa: UP045
        (int | None, None),
        (bytes, b""),
        (tuple[int, ...], ()),
        (set[str], set()),
        (None, None),
        (Any, None),
        (Movie, {"title": "", "year": 0, "genres": []}),
        (Point, Point(0.0, 0.0)),
    ],
)
def test_zero_values(annotation: Any, zero: Any) -> None:
    """Each annotation maps to its D3.5 zero value."""
    value = zero_value_for(annotation)
    assert value == zero
    assert type(value) is type(zero)


def test_zero_value_of_a_dataclass_is_its_fields_zero_values() -> None:
    """A record's zero value holds its fields' zero values, recursively."""
    assert zero_value_for(User) == User("", 0, 0.0, False, [], {}, None, Address("", 0))


def test_zero_values_are_fresh_each_time() -> None:
    """Mutable zero values are never shared between calls."""
    assert zero_value_for(list[int]) is not zero_value_for(list[int])


async def test_propagate_is_the_default(virtual_clock: VirtualClock) -> None:
    """on_error=propagate re-raises the error."""
    with pytest.raises(ConnectionError):
        await Policy("op").execute(AsyncFlaky(1))


async def test_skip_returns_the_zero_value(virtual_clock: VirtualClock) -> None:
    """on_error=skip returns the zero value after retries are exhausted."""
    policy = Policy("op", retry=2, on_error="skip", zero=0)
    assert await policy.execute(AsyncFlaky(5)) == 0


async def test_skip_handles_timeouts(virtual_clock: VirtualClock) -> None:
    """on_error also handles attempt timeouts."""
    assert await Policy("op", timeout=1, on_error="skip", zero="").execute(Hang()) == ""
    assert virtual_clock.now() == 1.0


def test_skip_returns_a_fresh_mutable_zero(virtual_clock: VirtualClock) -> None:
    """A list zero value is a new list each time, never shared."""
    policy = Policy("op", on_error="skip", zero=[])
    first = policy.execute_sync(Flaky(5))
    first.append(1)
    assert policy.execute_sync(Flaky(5)) == []


def test_log_warns_and_returns_the_zero_value(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """on_error=log logs a warning naming the call and the error, then returns the zero."""
    with caplog.at_level(logging.WARNING, logger="timebound.policies"):
        assert Policy("GetUser", on_error="log", zero=0).execute_sync(Flaky(1)) == 0
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.WARNING
    assert "GetUser failed" in record.getMessage()
    assert "ConnectionError: failure 1" in record.getMessage()


async def test_wrap_returns_ok_on_success(virtual_clock: VirtualClock) -> None:
    """on_error=wrap turns a success into Ok(value)."""
    result = await Policy("op", on_error="wrap").execute(AsyncFlaky(0))
    assert result == Ok("ok")
    assert result.ok and result.unwrap() == "ok"


async def test_wrap_returns_err_on_failure(virtual_clock: VirtualClock) -> None:
    """on_error=wrap turns the final failure into Err(error)."""
    result = await Policy("op", retry=1, on_error="wrap").execute(AsyncFlaky(5))
    assert isinstance(result, Err)
    assert not result.ok
    assert isinstance(result.error, RetryExhausted)
    with pytest.raises(RetryExhausted):
        result.unwrap()


async def test_fallback_takes_precedence_over_on_error(virtual_clock: VirtualClock) -> None:
    """on_error applies only when no fallback handles the failure."""
    assert (
        await Policy("op", fallback="fb", on_error="skip", zero="").execute(AsyncFlaky(1)) == "fb"
    )


async def test_on_error_handles_what_fallback_on_excludes(virtual_clock: VirtualClock) -> None:
    """An error the fallback does not cover goes to on_error."""
    policy = Policy("op", fallback="fb", fallback_on=(TimeoutError,), on_error="skip", zero=-1)
    assert await policy.execute(AsyncFlaky(1, error=ValueError)) == -1


async def test_spent_caller_deadline_is_never_skipped(virtual_clock: VirtualClock) -> None:
    """on_error does not turn a spent inherited deadline into a zero value."""
    with inherit_deadline(Deadline.after(1)):
        with pytest.raises(DeadlineExceeded):
            await Policy("op", timeout=5, on_error="skip", zero=0).execute(Hang())


def test_decorator_derives_the_zero_from_the_return_annotation(
    virtual_clock: VirtualClock,
) -> None:
    """@resilient(on_error="skip") on a function returning User returns User's zero value."""

    @tb.resilient(on_error="skip")
    def get_user(user_id: int) -> User:
        raise ConnectionError

    assert get_user(1) == User("", 0, 0.0, False, [], {}, None, Address("", 0))


async def test_async_decorator_derives_the_zero(virtual_clock: VirtualClock) -> None:
    """An async function's return annotation gives the zero value too."""

    @tb.resilient(on_error="log")
    async def count() -> int:
        raise ConnectionError

    assert await count() == 0


def test_decorator_zero_override(virtual_clock: VirtualClock) -> None:
    """zero= overrides the annotation."""

    @tb.resilient(on_error="skip", zero="n/a")
    def name() -> str:
        raise ConnectionError

    assert name() == "n/a"


def test_sync_wrap_returns_err_for_a_timeout(virtual_clock: VirtualClock) -> None:
    """Sync: a late attempt under wrap becomes Err(DeadlineExceeded(source=attempt))."""
    from ._helpers import SlowSync

    result = Policy("op", timeout=1, on_error="wrap").execute_sync(SlowSync(2))
    assert isinstance(result, Err)
    assert isinstance(result.error, DeadlineExceeded)
    assert result.error.source == "attempt"


def test_skip_absorbs_a_deadline_from_a_scope_inside_the_call(
    virtual_clock: VirtualClock,
) -> None:
    """on_error=skip returns the zero value when the call's own inner scope overran."""

    def fn() -> int:
        with fail_after(1):
            _clock.sleep(2)
        return 7

    assert Policy("op", on_error="skip", zero=0).execute_sync(fn) == 0
    assert virtual_clock.now() == 2.0
