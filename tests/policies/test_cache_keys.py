"""Cache keys and cached values (D3.6): no identity keys, no look-alike collisions, no
shared mutable results."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import uuid
from collections import OrderedDict
from typing import Any

import pytest

import timebound as tb
from timebound.policies import InMemoryCache, Policy, cache_key
from timebound.policies._cache import Uncacheable
from timebound.testing import VirtualClock


class Account:
    """A plain class: equality is identity, its repr holds its address."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    @tb.resilient(cache="1min")
    def statement(self) -> str:
        return f"statement of {self.owner}"


def test_methods_of_plain_objects_never_return_another_objects_result(
    virtual_clock: VirtualClock,
) -> None:
    """``self`` known only by its address is not a key: each customer gets their statement,
    however CPython reuses addresses."""
    for i in range(100):
        owner = f"customer {i}"
        assert Account(owner).statement() == f"statement of {owner}"


def test_an_object_with_only_an_identity_has_no_key() -> None:
    """cache_key refuses an argument whose only encoding would be its identity."""
    with pytest.raises(Uncacheable, match="cache_key="):
        cache_key("m", (object(),), {})


def test_a_custom_repr_is_not_trusted_as_an_encoding() -> None:
    """A repr that leaves the state out cannot make two different objects one entry."""

    class Opaque:
        def __init__(self, v: int) -> None:
            self.v = v

        def __repr__(self) -> str:
            return "Opaque()"

    with pytest.raises(Uncacheable):
        cache_key("m", (Opaque(1),), {})


def test_cache_key_function_caches_calls_on_plain_objects(virtual_clock: VirtualClock) -> None:
    """cache_key= gives such calls a key of the user's choosing."""
    calls: list[str] = []

    class Customer:
        def __init__(self, cid: str) -> None:
            self.cid = cid

    def load(c: Customer) -> str:
        calls.append(c.cid)
        return c.cid

    policy = Policy("load", cache="1min", cache_key=lambda c: c.cid)
    assert policy.execute_sync(load, (Customer("a"),)) == "a"
    assert policy.execute_sync(load, (Customer("a"),)) == "a"
    assert policy.execute_sync(load, (Customer("b"),)) == "b"
    assert calls == ["a", "b"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (float("inf"), "float:inf"),
        (float("-inf"), "float:-inf"),
        (float("nan"), "float:nan"),
        (float("inf"), "inf"),
        (float("nan"), "nan"),
    ],
)
def test_non_finite_floats_never_meet_strings(value: float, text: str) -> None:
    """inf, -inf and nan have keys no string can have."""
    assert cache_key("m", (value,), {}) != cache_key("m", (text,), {})


def test_ordered_dicts_in_different_orders_have_different_keys() -> None:
    """OrderedDicts compare by order, so their keys do too."""
    a = OrderedDict([("x", 1), ("y", 2)])
    b = OrderedDict([("y", 2), ("x", 1)])
    assert a != b
    assert cache_key("m", (a,), {}) != cache_key("m", (b,), {})
    assert cache_key("m", (a,), {}) == cache_key("m", (OrderedDict(a),), {})


def test_plain_dicts_still_ignore_order() -> None:
    """Equal dicts are equal in any order, and so are their keys."""
    assert cache_key("m", ({"x": 1, "y": 2},), {}) == cache_key("m", ({"y": 2, "x": 1},), {})


def test_a_scalar_subclass_is_encoded_by_its_value() -> None:
    """An int subclass whose repr hides its value still gets a key per value."""

    class Id(int):
        def __repr__(self) -> str:
            return "Id"

    assert cache_key("m", (Id(1),), {}) != cache_key("m", (Id(2),), {})


def test_dataclasses_compared_by_identity_have_no_key() -> None:
    """A dataclass with eq=False is known by identity: no key."""

    @dataclasses.dataclass(eq=False)
    class Handle:
        n: int

    with pytest.raises(Uncacheable):
        cache_key("m", (Handle(1),), {})


@pytest.mark.parametrize(
    "value",
    [
        decimal.Decimal("1.10"),
        datetime.date(2026, 1, 2),
        datetime.timedelta(seconds=3),
        uuid.UUID(int=7),
        1 + 2j,
    ],
)
def test_standard_value_types_have_keys(value: Any) -> None:
    """The standard library's value types encode by value."""
    assert cache_key("m", (value,), {}) == cache_key("m", (copy.deepcopy(value),), {})


def test_a_hit_returns_a_copy(virtual_clock: VirtualClock) -> None:
    """One caller mutating its result does not change what the next caller gets."""
    policy = Policy("rows", cache="1min")

    def rows() -> list[int]:
        return [1, 2]

    first = policy.execute_sync(rows)
    first.append(3)
    second = policy.execute_sync(rows)
    assert second == [1, 2]
    second.append(4)
    assert policy.execute_sync(rows) == [1, 2]


def test_the_stored_value_is_a_copy_of_the_result(virtual_clock: VirtualClock) -> None:
    """Mutating the result the call itself returned does not reach the cache either."""
    cache = InMemoryCache()
    cache.set("k", {"a": [1]}, 60)
    hit, value = cache.get("k")
    assert hit
    value["a"].append(2)
    assert cache.get("k") == (True, {"a": [1]})


def test_a_value_that_cannot_be_copied_is_not_cached(virtual_clock: VirtualClock) -> None:
    """A result deepcopy refuses is returned, uncached, with the call still succeeding."""
    import threading

    calls = 0

    def lock() -> Any:
        nonlocal calls
        calls += 1
        return threading.Lock()

    policy = Policy("lock", cache="1min")
    policy.execute_sync(lock)
    policy.execute_sync(lock)
    assert calls == 2


def test_two_functions_with_one_qualname_keep_their_own_entries(
    virtual_clock: VirtualClock,
) -> None:
    """Two different functions named alike under resilient(cache=...) never see each other's
    results (D3.7)."""

    def make(result: str) -> Any:
        @tb.resilient(cache="1min")
        def lookup(key: str) -> str:
            return result

        return lookup

    first, second = make("first"), make("second")
    assert first.__qualname__ == second.__qualname__
    assert first("k") == "first"
    assert second("k") == "second"


def test_one_policy_running_two_functions_keys_them_apart(virtual_clock: VirtualClock) -> None:
    """The key names the function, so one policy executing two functions does not mix them."""
    policy = Policy("p", cache="1min")

    def a(x: int) -> str:
        return "a"

    def b(x: int) -> str:
        return "b"

    assert policy.execute_sync(a, (1,)) == "a"
    assert policy.execute_sync(b, (1,)) == "b"


def test_an_uncached_call_is_reported_once_per_policy(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The first call without a canonical key logs a warning naming cache_key=; later ones not."""
    policy = Policy("plain", cache="1min")

    def f(x: object) -> int:
        return 1

    with caplog.at_level("WARNING", logger="timebound.policies"):
        policy.execute_sync(f, (object(),))
        policy.execute_sync(f, (object(),))
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "cache_key=" in warnings[0].getMessage()
