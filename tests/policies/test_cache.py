"""Cache (D3.6): key = name + canonical arguments, only successes, TTL on timebound's clock."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pytest

import timebound as tb
from timebound.policies import (
    CacheBackend,
    InMemoryCache,
    Ok,
    Policy,
    cache_key,
)
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky, Hang


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Query:
    text: str
    limit: int


async def test_hit_returns_without_calling(virtual_clock: VirtualClock) -> None:
    """A second call with equal arguments within the TTL is served from the cache."""
    fn = AsyncFlaky(0)
    policy = Policy("CacheHit", cache="1min")
    assert await policy.execute(fn, ("a",)) == "ok"
    assert await policy.execute(fn, ("a",)) == "ok"
    assert len(fn.calls) == 1


async def test_different_arguments_miss(virtual_clock: VirtualClock) -> None:
    """Different arguments are different entries."""
    fn = AsyncFlaky(0)
    policy = Policy("CacheMiss", cache="1min")
    await policy.execute(fn, ("a",))
    await policy.execute(fn, ("b",))
    assert len(fn.calls) == 2


async def test_entry_expires_at_exactly_the_ttl(virtual_clock: VirtualClock) -> None:
    """An entry stored at t=0 with a 10 s TTL is live at 9.999 and dead at 10."""
    fn = AsyncFlaky(0)
    policy = Policy("CacheTtl", cache=10)
    await policy.execute(fn)
    virtual_clock.advance(9.999)
    await policy.execute(fn)
    assert len(fn.calls) == 1
    virtual_clock.advance(0.001)
    await policy.execute(fn)
    assert fn.calls == [0.0, 10.0]


def test_sync_cache_hit_and_expiry(virtual_clock: VirtualClock) -> None:
    """The sync path reads and stores the same cache."""
    fn = Flaky(0)
    policy = Policy("CacheSync", cache="5s")
    policy.execute_sync(fn, (1,))
    policy.execute_sync(fn, (1,))
    virtual_clock.advance(5)
    policy.execute_sync(fn, (1,))
    assert fn.calls == [0.0, 5.0]


async def test_failures_and_timeouts_are_not_cached(virtual_clock: VirtualClock) -> None:
    """Errors, timeouts and on_error zero values never enter the cache."""
    fn = AsyncFlaky(1)
    policy = Policy("CacheFail", cache="1min", on_error="skip", zero="")
    assert await policy.execute(fn) == ""
    assert await policy.execute(fn) == "ok"
    assert await policy.execute(fn) == "ok"
    assert len(fn.calls) == 2
    hang = Policy("CacheHang", cache="1min", timeout=1, on_error="skip", zero="")
    assert await hang.execute(Hang()) == ""
    ok = AsyncFlaky(0)
    assert await Policy("CacheHang", cache="1min").execute(ok) == "ok"
    assert len(ok.calls) == 1


async def test_retried_success_is_cached(virtual_clock: VirtualClock) -> None:
    """A success after retries is the module's own success and is stored."""
    fn = AsyncFlaky(2)
    policy = Policy("CacheRetried", cache="1min", retry=2)
    await policy.execute(fn)
    await policy.execute(fn)
    assert len(fn.calls) == 3


async def test_policies_with_the_same_name_do_not_share_a_cache(
    virtual_clock: VirtualClock,
) -> None:
    """A name is a label: two policies named alike keep their own entries (D3.7)."""
    fn = AsyncFlaky(0)
    a = Policy("SharedCache", cache="1min")
    b = Policy("SharedCache", cache="1min", retry=2)
    await a.execute(fn, (1,))
    await b.execute(fn, (1,))
    assert len(fn.calls) == 2


async def test_policies_given_one_cache_share_its_entries(virtual_clock: VirtualClock) -> None:
    """Sharing is explicit: two policies given the same cache object serve each other's hits."""
    fn = AsyncFlaky(0)
    shared = InMemoryCache()
    a = Policy("Shared", cache="1min", cache_backend=shared)
    b = Policy("Shared", cache="1min", cache_backend=shared, retry=2)
    await a.execute(fn, (1,))
    await b.execute(fn, (1,))
    assert len(fn.calls) == 1


async def test_cache_hit_under_wrap_is_ok(virtual_clock: VirtualClock) -> None:
    """A cached value comes back as Ok under on_error=wrap."""
    policy = Policy("CacheWrap", cache="1min", on_error="wrap")
    await policy.execute(AsyncFlaky(0))
    assert await policy.execute(AsyncFlaky(5)) == Ok("ok")


async def test_cached_none_is_a_hit(virtual_clock: VirtualClock) -> None:
    """None results are cached like any other value."""
    fn = AsyncFlaky(0, value=None)
    policy = Policy("CacheNone", cache="1min")
    await policy.execute(fn)
    assert await policy.execute(fn) is None
    assert len(fn.calls) == 1


async def test_unhashable_arguments_are_fine(virtual_clock: VirtualClock) -> None:
    """Dicts and lists as arguments are encoded canonically, whatever the key order."""
    fn = AsyncFlaky(0)
    policy = Policy("CacheUnhashable", cache="1min")
    await policy.execute(fn, ({"a": [1, 2], "b": {"x": None}},))
    await policy.execute(fn, ({"b": {"x": None}, "a": [1, 2]},))
    assert len(fn.calls) == 1


async def test_cyclic_arguments_bypass_the_cache(virtual_clock: VirtualClock) -> None:
    """A cyclic argument cannot be encoded; the call simply runs uncached."""
    fn = AsyncFlaky(0)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    policy = Policy("CacheCycle", cache="1min")
    await policy.execute(fn, (cyclic,))
    await policy.execute(fn, (cyclic,))
    assert len(fn.calls) == 2


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (1, 1.0),
        (1, True),
        (1, "1"),
        ([1, 2], (1, 2)),
        ({"a": 1}, {"a": 1.0}),
        ({1, 2}, frozenset({1, 2})),
        (0.0, -0.0),
        (None, "null"),
        (b"ab", "ab"),
        (Color.RED, 1),
        (Query("q", 1), {"text": "q", "limit": 1}),
        ("a,b", ["a", "b"]),
    ],
)
def test_keys_do_not_collide(a: Any, b: Any) -> None:
    """Values that merely look alike have different keys."""
    assert cache_key("m", (a,), {}) != cache_key("m", (b,), {})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"x": 1, "y": 2}, {"y": 2, "x": 1}),
        ({3, 1, 2}, {2, 3, 1}),
        (Query("q", 1), Query("q", 1)),
        ([{"k": [1]}], [{"k": [1]}]),
    ],
)
def test_equal_values_have_equal_keys(a: Any, b: Any) -> None:
    """Equal values encode the same whatever their identity or ordering."""
    assert cache_key("m", (a,), {}) == cache_key("m", (b,), {})


def test_key_includes_the_name_and_kwargs() -> None:
    """The policy name and the keyword arguments (in any order) are part of the key."""
    assert cache_key("A", (1,), {}) != cache_key("B", (1,), {})
    assert cache_key("A", (), {"x": 1, "y": 2}) == cache_key("A", (), {"y": 2, "x": 1})
    assert cache_key("A", (1,), {}) != cache_key("A", (), {"x": 1})


class DictBackend:
    """A custom backend: records what it is asked and ignores TTLs."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.ttls: list[float] = []

    def get(self, key: str) -> tuple[bool, Any]:
        return (key in self.data, self.data.get(key))

    def set(self, key: str, value: Any, ttl: float) -> None:
        self.data[key] = value
        self.ttls.append(ttl)


async def test_custom_backend_instance(virtual_clock: VirtualClock) -> None:
    """A CacheBackend instance receives the TTL in seconds."""
    backend = DictBackend()
    assert isinstance(backend, CacheBackend)
    policy = Policy("CacheCustom", cache="2min", cache_backend=backend)
    await policy.execute(AsyncFlaky(0), ("k",))
    assert backend.ttls == [120.0]
    assert list(backend.data.values()) == ["ok"]


async def test_memory_names_a_cache_of_the_policys_own(virtual_clock: VirtualClock) -> None:
    """cache_backend="memory" is the built-in backend: a fresh in-memory cache per policy."""
    fn = AsyncFlaky(0)
    a = Policy("Mem", cache="1min", cache_backend="memory")
    b = Policy("Mem", cache="1min", cache_backend="memory")
    await a.execute(fn, (1,))
    await a.execute(fn, (1,))
    await b.execute(fn, (1,))
    assert len(fn.calls) == 2


def test_any_other_backend_name_says_what_to_write() -> None:
    """A backend name other than "memory" is refused with what to pass instead."""
    with pytest.raises(tb.ConfigurationError, match="pass the backend object") as info:
        Policy("p", cache="1min", cache_backend="redis")
    assert info.value.option == "cache_backend"


def test_in_memory_cache_is_bounded(virtual_clock: VirtualClock) -> None:
    """InMemoryCache evicts the least recently used entry beyond max_entries."""
    cache = InMemoryCache(max_entries=2)
    cache.set("a", 1, 10)
    cache.set("b", 2, 10)
    assert cache.get("a") == (True, 1)
    cache.set("c", 3, 10)
    assert cache.get("b") == (False, None)
    assert cache.get("a") == (True, 1)
    assert len(cache) == 2


async def test_deeply_nested_arguments_bypass_the_cache(virtual_clock: VirtualClock) -> None:
    """An argument nested deeper than the recursion limit runs uncached instead of failing."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    fn = AsyncFlaky(0)
    policy = Policy("CacheDeep", cache="1min")
    assert await policy.execute(fn, (deep,)) == "ok"
    assert await policy.execute(fn, (deep,)) == "ok"
    assert len(fn.calls) == 2


class BadRepr:
    """An argument whose repr() raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_arguments_whose_repr_fails_bypass_the_cache(virtual_clock: VirtualClock) -> None:
    """A failing repr() makes the call run uncached rather than fail."""
    fn = Flaky(0)
    policy = Policy("CacheBadRepr", cache="1min")
    assert policy.execute_sync(fn, (BadRepr(),)) == "ok"
    assert policy.execute_sync(fn, (BadRepr(),)) == "ok"
    assert len(fn.calls) == 2


class BrokenBackend:
    """A backend whose every operation fails, like a cache server that is down."""

    def get(self, key: str) -> tuple[bool, Any]:
        raise ConnectionError("cache down")

    def set(self, key: str, value: Any, ttl: float) -> None:
        raise ConnectionError("cache down")


def test_a_failing_backend_never_fails_the_call(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """get() failures are misses and set() failures are logged; the call still succeeds."""
    fn = Flaky(0)
    policy = Policy("CacheBroken", cache="1min", cache_backend=BrokenBackend())
    assert policy.execute_sync(fn) == "ok"
    assert policy.execute_sync(fn) == "ok"
    assert len(fn.calls) == 2
    assert any("cache backend get() failed" in r.getMessage() for r in caplog.records)
    assert any("cache backend set() failed" in r.getMessage() for r in caplog.records)


def test_positional_keyword_and_default_spellings_share_an_entry(
    virtual_clock: VirtualClock,
) -> None:
    """f(1), f(a=1) and f(1, b=2) with b defaulting to 2 are one call for the cache (D3.6)."""
    calls: list[tuple[int, int]] = []

    @tb.resilient(cache=60)
    def f(a: int, b: int = 2) -> int:
        calls.append((a, b))
        return a + b

    assert [f(1), f(a=1), f(1, b=2), f(1, 2)] == [3, 3, 3, 3]
    assert calls == [(1, 2)]
    assert f(1, 3) == 4
    assert calls == [(1, 2), (1, 3)]
