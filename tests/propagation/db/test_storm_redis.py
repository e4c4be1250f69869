"""Storms against the real Redis: deadlines and cancellations firing at random instants.

Every command echoes a token of its own (``ECHO``, pipelines of ``ECHO``s, ``GET`` of a key whose
value names it), so a reply that reaches the wrong caller — the failure of redis-py#2624 and
CVE-2023-28858, a command cancelled mid-flight leaving its reply for the next one — cannot go
unseen. Budgets are drawn from 0 to a few ms, so cuts land before sending, while sending, and
while the reply is on its way. Bounded in count (a few seconds at most).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions

import timebound as tb
from timebound.propagation.redis import afrom_url, from_url

from .conftest import unique

pytestmark = pytest.mark.redis

WORKERS = 8
OPS_PER_WORKER = 80
MAX_BUDGET = 0.003
#: What a cut command may raise; anything else (a wrong reply above all) fails the storm.
CUT = (tb.DeadlineExceeded, tb.RetryExhausted, asyncio.CancelledError)


@pytest.fixture
def named_keys(redis_url: str) -> Iterator[list[str]]:
    """Keys whose value is their own name, deleted afterwards."""
    names = [unique("named") for _ in range(16)]
    with redis.Redis.from_url(redis_url) as plain:
        plain.mset({name: name for name in names})
    yield names
    with redis.Redis.from_url(redis_url) as plain:
        plain.delete(*names)


def _record_read_errors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the exception type each redis-py async reply read ends with."""
    seen: list[str] = []
    base = redis.asyncio.Connection.read_response

    async def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await base(self, *args, **kwargs)
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise

    monkeypatch.setattr(redis.asyncio.Connection, "read_response", recording)
    return seen


async def _async_storm(
    client: redis.asyncio.Redis,
    named: list[str],
    rnd: random.Random,
    cut: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
) -> list[tuple[Any, Any]]:
    """Run the storm; returns every (expected, received) pair that differs."""
    wrong: list[tuple[Any, Any]] = []

    @tb.resilient(timeout=MAX_BUDGET / 2, retry=2)
    async def echo_twice(a: str, b: str) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            pipe.echo(a).echo(b)
            return await pipe.execute()  # type: ignore[no-any-return]

    async def op(w: int, k: int) -> None:
        kind = rnd.randrange(3)
        token = f"{w}:{k}"
        if kind == 0:
            expected: Any = token.encode()
            got = await cut(lambda: client.echo(token))
        elif kind == 1:
            expected = [f"{token}a".encode(), f"{token}b".encode()]
            got = await echo_twice(f"{token}a", f"{token}b")
        else:
            key = rnd.choice(named)
            expected = key.encode()
            got = await cut(lambda: client.get(key))
        if got != expected:
            wrong.append((expected, got))

    async def worker(w: int) -> None:
        for k in range(OPS_PER_WORKER):
            try:
                await op(w, k)
            except CUT:
                pass

    await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    return wrong


async def _usable(client: redis.asyncio.Redis, named: list[str]) -> bool:
    """Every connection the client opens answers its own commands."""
    replies = await asyncio.gather(*(client.get(key) for key in named))
    return replies == [key.encode() for key in named] and await client.ping() is True


@pytest.mark.asyncio_real
async def test_async_storm_deadlines_never_cancel_a_command_mid_flight(
    redis_url: str, named_keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling scopes and attempt timeouts firing at random instants: every reply reaches its
    own caller, no reply read is ever interrupted by the deadline's cancellation (D4.8), and the
    client is usable afterwards."""
    rnd = random.Random(3)
    seen = _record_read_errors(monkeypatch)
    client = afrom_url(redis_url, socket_timeout=None)

    async def cut(call: Callable[[], Awaitable[Any]]) -> Any:
        async with tb.fail_after(rnd.uniform(0, MAX_BUDGET)):
            return await call()

    try:
        wrong = await _async_storm(client, named_keys, rnd, cut)
        assert wrong == []
        assert "CancelledError" not in seen
        assert await _usable(client, named_keys)
    finally:
        await client.aclose()


@pytest.mark.asyncio_real
async def test_async_storm_with_plain_cancels_never_misroutes_a_reply(
    redis_url: str, named_keys: list[str]
) -> None:
    """Inherited deadlines, cancelling scopes and plain cancellations with time left (once or
    twice), at random instants: every reply reaches its own caller, and the client is usable
    afterwards."""
    rnd = random.Random(5)
    client = afrom_url(redis_url, socket_timeout=None)

    async def cut(call: Callable[[], Awaitable[Any]]) -> Any:
        mode = rnd.randrange(4)
        budget = rnd.uniform(0, MAX_BUDGET)
        if mode == 0:
            async with tb.fail_after(budget):
                return await call()
        if mode == 1:
            with tb.inherit_deadline(tb.Deadline.after(budget)):
                return await call()

        async def with_time_left() -> Any:
            with tb.inherit_deadline(tb.Deadline.after(5)):
                return await call()

        task = asyncio.ensure_future(with_time_left())
        await asyncio.sleep(budget)
        task.cancel()
        if mode == 3:  # cancelled again while the first cancellation is being handled
            for _ in range(rnd.randrange(6)):
                await asyncio.sleep(0)
            task.cancel()
        return await task

    try:
        wrong = await _async_storm(client, named_keys, rnd, cut)
        assert wrong == []
        assert await _usable(client, named_keys)
    finally:
        await client.aclose()


def test_sync_storm_in_threads_never_misroutes_a_reply(
    redis_url: str, named_keys: list[str]
) -> None:
    """Threads sharing one client, each command under an inherited deadline of 0 to a few ms:
    every reply reaches its own caller, and the client is usable afterwards."""
    client = from_url(redis_url, socket_timeout=None)
    wrong: list[tuple[Any, Any]] = []
    unexpected: list[BaseException] = []

    def worker(w: int) -> None:
        rnd = random.Random(w)
        for k in range(OPS_PER_WORKER):
            token = f"{w}:{k}"
            key = rnd.choice(named_keys)
            try:
                with tb.inherit_deadline(tb.Deadline.after(rnd.uniform(0, MAX_BUDGET))):
                    if rnd.randrange(2):
                        expected: Any = token.encode()
                        got = client.echo(token)
                    else:
                        expected = [key.encode(), token.encode()]
                        got = client.pipeline(transaction=False).get(key).echo(token).execute()
            except tb.DeadlineExceeded:
                continue
            except BaseException as exc:
                unexpected.append(exc)
                return
            if got != expected:
                wrong.append((expected, got))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert unexpected == []
        assert wrong == []
        assert [client.get(key) for key in named_keys] == [key.encode() for key in named_keys]
    finally:
        client.close()
