"""redis-py (sync and asyncio) under a deadline, against the real Redis."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions
from redis.backoff import AbstractBackoff, NoBackoff
from redis.retry import Retry

import timebound as tb
from timebound.propagation import RequestState
from timebound.propagation.db import _common as _db_common
from timebound.propagation.db import _redis as _db_redis
from timebound.propagation.redis import afrom_url, from_url
from timebound.telemetry import counters

from .conftest import in_request, leave_request, unique

pytestmark = pytest.mark.redis


class CountingBackoff(AbstractBackoff):
    """A backoff that records every retry redis-py decides to make."""

    def __init__(self) -> None:
        self.retries = 0

    def reset(self) -> None:
        pass

    def compute(self, failures: int) -> float:
        self.retries += 1
        return 0.0


@pytest.fixture
def keys(redis_url: str) -> Iterator[list[str]]:
    """Unique key names for one test, deleted afterwards."""
    names: list[str] = []
    yield names
    if names:
        with redis.Redis.from_url(redis_url) as plain:
            plain.delete(*names)


def test_blpop_wait_ends_at_the_deadline_and_the_connection_is_discarded(
    redis_url: str, keys: list[str], request_state: RequestState
) -> None:
    """BLPOP with a 5 s server timeout under a 200 ms deadline: released at the deadline, and
    the next command on the client gets its own reply, not BLPOP's late one (redis-py#2624)."""
    queue, mine = unique("queue"), unique("mine")
    keys += [queue, mine]
    client = from_url(redis_url)
    client.set(mine, "mine")
    first_id = client.client_id()
    with tb.inherit_deadline(tb.Deadline.after(0.2)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            client.blpop([queue], timeout=5)
    assert info.value.source == "inherited"
    assert isinstance(info.value.__cause__, redis.exceptions.TimeoutError)
    assert request_state.cancelled_by_deadline is True
    # Make BLPOP's reply ready: a reused connection would now hand it to the next command.
    client.rpush(queue, "late")
    assert client.get(mine) == b"mine"
    assert client.client_id() != first_id
    client.close()


def test_spent_deadline_fails_fast_and_sends_nothing(
    redis_url: str, keys: list[str], request_state: RequestState
) -> None:
    """With the deadline spent the command raises the binding bound's error; nothing is sent."""
    key = unique("nothing")
    keys.append(key)
    client = from_url(redis_url)
    with tb.inherit_deadline(tb.Deadline.after(0)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            client.set(key, "x")
    assert info.value.source == "inherited"
    assert client.exists(key) == 0
    assert request_state.cancelled_by_deadline is True
    assert counters.get("cancelled-by-deadline", component="redis") == 1
    client.close()


def test_spent_deadline_is_not_retried(redis_url: str, keys: list[str]) -> None:
    """redis-py retries TimeoutErrors; a DeadlineExceeded (one of them) is never retried."""
    queue = unique("noretry")
    keys.append(queue)
    backoff = CountingBackoff()
    client = from_url(redis_url, retry=Retry(backoff, 3))
    with tb.inherit_deadline(tb.Deadline.after(0.1)):
        with pytest.raises(tb.DeadlineExceeded):
            client.blpop([queue], timeout=5)
    assert backoff.retries == 0
    client.close()


def test_tighter_socket_timeout_stays_redis_own_error(
    redis_url: str, keys: list[str], request_state: RequestState
) -> None:
    """A socket timeout shorter than the deadline fails as redis-py does; no deadline error."""
    queue = unique("static")
    keys.append(queue)
    client = from_url(redis_url, socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
    with tb.inherit_deadline(tb.Deadline.after(5)):
        with pytest.raises(redis.exceptions.TimeoutError) as info:
            client.blpop([queue], timeout=5)
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert request_state.cancelled_by_deadline is False
    client.close()


def test_without_a_deadline_commands_are_unchanged(redis_url: str, keys: list[str]) -> None:
    """No deadline: commands run as redis-py runs them; nothing is counted."""
    key = unique("plain")
    keys.append(key)
    client = from_url(redis_url)
    client.set(key, "v")
    assert client.get(key) == b"v"
    assert counters.total("timeout-updated-by-deadline") == 0
    client.close()


def test_pipeline_wait_is_bounded_and_the_next_pipeline_is_correct(
    redis_url: str, keys: list[str]
) -> None:
    """A pipeline's replies are awaited no longer than the deadline; the next one reads its own."""
    queue, mine = unique("pqueue"), unique("pmine")
    keys += [queue, mine]
    client = from_url(redis_url)
    client.set(mine, "mine")
    with tb.inherit_deadline(tb.Deadline.after(0.2)):
        with pytest.raises(tb.DeadlineExceeded):
            client.pipeline(transaction=False).get(mine).blpop([queue], timeout=5).execute()
    client.rpush(queue, "late")
    assert client.pipeline(transaction=False).get(mine).ping().execute() == [b"mine", True]
    client.close()


@pytest.mark.asyncio_real
async def test_async_blpop_wait_ends_at_the_deadline_and_the_connection_is_discarded(
    redis_url: str, keys: list[str]
) -> None:
    """asyncio: released at the deadline without cancelling the task mid-command; the next
    command gets its own reply (redis-py#2624, CVE-2023-28858)."""
    queue, mine = unique("aqueue"), unique("amine")
    keys += [queue, mine]
    client = afrom_url(redis_url)
    state, token = in_request()
    try:
        await client.set(mine, "mine")
        first_id = await client.client_id()
        with tb.inherit_deadline(tb.Deadline.after(0.2)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                await client.blpop([queue], timeout=5)
        await client.rpush(queue, "late")
        assert await client.get(mine) == b"mine"
        assert await client.client_id() != first_id
    finally:
        leave_request(token)
        await client.aclose()
    assert info.value.source == "inherited"
    assert state.cancelled_by_deadline is True


def test_connection_setup_is_not_counted_as_the_users_commands(
    redis_url: str, keys: list[str]
) -> None:
    """One GET on a fresh connection under a deadline counts one lowered timeout, not the
    handshake's commands too."""
    key = unique("setup")
    keys.append(key)
    client = from_url(redis_url)
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            assert client.get(key) is None
        assert counters.get("timeout-updated-by-deadline", component="redis") == 1
    finally:
        client.close()


@pytest.mark.asyncio_real
async def test_async_connection_setup_is_not_counted_as_the_users_commands(
    redis_url: str, keys: list[str]
) -> None:
    """asyncio: one GET on a fresh connection under a deadline counts one lowered timeout."""
    key = unique("asetup")
    keys.append(key)
    client = afrom_url(redis_url)
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            assert await client.get(key) is None
        assert counters.get("timeout-updated-by-deadline", component="redis") == 1
    finally:
        await client.aclose()


@pytest.mark.asyncio_real
async def test_async_spent_deadline_fails_fast(redis_url: str, keys: list[str]) -> None:
    """asyncio: a spent deadline raises at once and sends nothing."""
    key = unique("anothing")
    keys.append(key)
    client = afrom_url(redis_url)
    try:
        with tb.inherit_deadline(tb.Deadline.after(0)):
            with pytest.raises(tb.DeadlineExceeded):
                await client.set(key, "x")
        assert await client.exists(key) == 0
    finally:
        await client.aclose()


@pytest.mark.asyncio_real
async def test_async_enclosing_scope_is_reported_as_the_source(
    redis_url: str, keys: list[str]
) -> None:
    """When an attempt scope is the binding bound, the error says ``attempt``."""
    queue = unique("ascope")
    keys.append(queue)
    client = afrom_url(redis_url)
    try:
        with tb.inherit_deadline(tb.Deadline.after(30)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.fail_after(0.2, source="attempt"):
                    await client.blpop([queue], timeout=5)
        assert info.value.source == "attempt"
        assert await client.ping() is True
    finally:
        await client.aclose()


def test_retry_policy_replaced_later_is_still_guarded(redis_url: str) -> None:
    """A retry policy set after construction is wrapped too (``Redis.set_retry``)."""
    client = from_url(redis_url)
    client.set_retry(Retry(NoBackoff(), 2))
    conn: Any = client.connection_pool.get_connection()
    try:
        assert type(conn.retry).__name__ == "_NoRetryPastDeadline"
        assert conn.retry.get_retries() == 2
    finally:
        client.connection_pool.release(conn)
        client.close()


@pytest.mark.asyncio_real
async def test_async_cancelling_scope_does_not_cancel_the_command_mid_flight(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``fail_after`` that fires while BLPOP waits: redis-py's read is never interrupted by
    the cancellation (it ends by its own bounded wait), the scope reports itself, and the next
    command gets its own reply (D4.8, redis-py#2624, CVE-2023-28858)."""
    seen: list[str] = []
    base = redis.asyncio.Connection.read_response

    async def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await base(self, *args, **kwargs)
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise

    monkeypatch.setattr(redis.asyncio.Connection, "read_response", recording)
    queue, mine = unique("acancel"), unique("amine")
    keys += [queue, mine]
    client = afrom_url(redis_url)
    try:
        await client.set(mine, "mine")
        seen.clear()
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(0.2, source="attempt"):
                await client.blpop([queue], timeout=5)
        assert info.value.source == "attempt"
        assert "CancelledError" not in seen
        assert "TimeoutError" in seen
        await client.rpush(queue, "late")
        assert await client.get(mine) == b"mine"
    finally:
        await client.aclose()


@pytest.mark.asyncio_real
async def test_async_explicit_cancel_releases_the_caller_at_once(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit cancel long before the deadline interrupts the wait at once (it is not held
    back like the deadline's own cancel) and stays a CancelledError (D2.3)."""
    seen = _record_read_errors(monkeypatch)
    queue = unique("aexplicit")
    keys.append(queue)
    # No socket timeout of its own (redis-py's default, 5 s, would be the tighter bound and
    # the deadline would not bound the read at all).
    client = afrom_url(redis_url, socket_timeout=None)

    async def wait() -> Any:
        with tb.inherit_deadline(tb.Deadline.after(30)):
            return await client.blpop([queue], timeout=25)

    try:
        await client.ping()  # connected: the handshake's replies are not recorded
        seen.clear()
        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0.1)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2)
        assert done == {task}
        assert task.cancelled()
        assert seen == ["CancelledError"]
        assert await client.ping() is True
    finally:
        await client.aclose()


def _record_read_errors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the exception type every redis-py async reply read ends with."""
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


@pytest.mark.asyncio_real
async def test_async_cancel_while_the_deadline_read_ends_interrupts_it(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that arrives while a deadline-cut read is left to end stays a CancelledError and
    the connection is not reused mid-command (D2.3, redis-py#2624)."""
    seen = _record_read_errors(monkeypatch)
    queue = unique("asecond")
    keys.append(queue)
    client = afrom_url(redis_url, socket_timeout=None)
    settle = _db_common._settle
    settling: list[bool] = []

    async def cancelled_while_settling(*args: Any) -> None:
        # The deadline's cancel was just taken; the task's owner cancels it in the same moment.
        settling.append(True)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await settle(*args)

    monkeypatch.setattr(_db_common, "_settle", cancelled_while_settling)

    async def wait() -> Any:
        with tb.fail_after(0.2):
            return await client.blpop([queue], timeout=5)

    try:
        await client.ping()  # connected: the handshake's replies are not recorded
        seen.clear()
        task = asyncio.ensure_future(wait())
        await asyncio.wait([task])
        assert task.cancelled()
        assert settling == [True]  # the deadline's cancel was taken, then the owner's came
        # The read was stopped (cancelled, or its own wait ended in the same instant, since
        # it ends at the deadline too): it never completed with a reply nobody reads.
        assert len(seen) == 1 and seen[0] in {"CancelledError", "TimeoutError"}
        monkeypatch.setattr(_db_common, "_settle", settle)
        await client.rpush(queue, "late")
        assert await client.lpop(queue) == b"late"
    finally:
        await client.aclose()


@pytest.mark.asyncio_real
async def test_async_pipeline_cut_after_a_reply_never_hands_the_rest_to_another_command(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelling scope fires while a pipeline's first reply is being read; that read ends
    normally, the scope raises — and the pipeline's second reply, still due, never reaches the
    next command (the connection is closed, not returned with a reply on it)."""
    client = afrom_url(redis_url, socket_timeout=None)
    base = redis.asyncio.Connection.read_response
    reads = 0

    async def slow_first_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        reply = await base(self, *args, **kwargs)
        if reads == 1:
            await asyncio.sleep(0.3)  # the scope's deadline passes while this read is on
        return reply

    try:
        await client.ping()  # connected: the handshake is over
        monkeypatch.setattr(redis.asyncio.Connection, "read_response", slow_first_read)
        with pytest.raises(tb.DeadlineExceeded):
            async with tb.fail_after(0.1):
                async with client.pipeline(transaction=False) as pipe:
                    await pipe.echo("first").echo("second").execute()
        assert reads == 1
        assert await client.echo("next") == b"next"
    finally:
        await client.aclose()


def _record_disconnects(monkeypatch: pytest.MonkeyPatch, cls: Any) -> list[bool]:
    """Record every ``disconnect()`` of a redis-py connection class."""
    closed: list[bool] = []
    base = cls.disconnect

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        closed.append(True)
        return base(self, *args, **kwargs)

    monkeypatch.setattr(cls, "disconnect", recording)
    return closed


def _second_send_finds_the_deadline_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the adapter's fail-fast check raise on the second command sent: in a fresh
    connection's handshake, after the first ``CLIENT SETINFO`` went out, before the second."""
    real = _db_redis._fail_fast
    calls = 0

    def fail_fast() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise tb.DeadlineExceeded(source="inherited", what="redis command")
        real()

    monkeypatch.setattr(_db_redis, "_fail_fast", fail_fast)


def test_handshake_cut_part_way_leaves_no_reply_for_the_next_command(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadline spent between the handshake's pipelined commands: the connection is closed,
    so the reply still due to the first one never reaches the next command."""
    key = unique("handshake")
    keys.append(key)
    with redis.Redis.from_url(redis_url) as plain:
        plain.set(key, "mine")
    client = from_url(redis_url, socket_timeout=None)
    closed = _record_disconnects(monkeypatch, redis.Connection)
    try:
        _second_send_finds_the_deadline_spent(monkeypatch)
        with pytest.raises(tb.DeadlineExceeded):
            client.get(key)
        # Closed at once: redis-py's pool only notices a reply that has already arrived.
        assert closed
        monkeypatch.undo()
        assert client.get(key) == b"mine"
    finally:
        client.close()


@pytest.mark.asyncio_real
async def test_async_handshake_cut_part_way_leaves_no_reply_for_the_next_command(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio: a deadline spent between the handshake's pipelined commands closes the
    connection; the next command reads its own reply."""
    key = unique("ahandshake")
    keys.append(key)
    with redis.Redis.from_url(redis_url) as plain:
        plain.set(key, "mine")
    client = afrom_url(redis_url, socket_timeout=None)
    closed = _record_disconnects(monkeypatch, redis.asyncio.Connection)
    try:
        _second_send_finds_the_deadline_spent(monkeypatch)
        with pytest.raises(tb.DeadlineExceeded):
            await client.get(key)
        assert closed
        monkeypatch.undo()
        assert await client.get(key) == b"mine"
    finally:
        await client.aclose()


def test_guarded_retry_copied_into_another_client_stays_guarded_once(redis_url: str) -> None:
    """A guarded retry passed on to a new client is deep-copied (as redis-py does) unnested."""
    first = from_url(redis_url, retry=Retry(NoBackoff(), 2))
    conn: Any = first.connection_pool.get_connection()
    second = from_url(redis_url, retry=conn.retry)
    copied: Any = second.connection_pool.get_connection()
    try:
        assert type(copied.retry).__name__ == "_NoRetryPastDeadline"
        assert type(copied.retry._inner) is Retry
        assert copied.retry is not conn.retry and copied.retry._inner is not conn.retry._inner
        assert copied.retry.get_retries() == 2
    finally:
        first.connection_pool.release(conn)
        second.connection_pool.release(copied)
        first.close()
        second.close()


def _send_then_outlive_the_deadline(monkeypatch: pytest.MonkeyPatch, cls: Any) -> None:
    """Make every send of ``cls`` return only 100 ms after the command went out, so a 50 ms
    deadline passes between the send and the wait for its reply."""
    base = cls.send_packed_command

    if inspect.iscoroutinefunction(base):

        async def slow_async(self: Any, *args: Any, **kwargs: Any) -> None:
            await base(self, *args, **kwargs)
            await asyncio.sleep(0.1)

        monkeypatch.setattr(cls, "send_packed_command", slow_async)
        return

    def slow(self: Any, *args: Any, **kwargs: Any) -> None:
        base(self, *args, **kwargs)
        time.sleep(0.1)

    monkeypatch.setattr(cls, "send_packed_command", slow)


def test_deadline_spent_between_send_and_read_closes_the_connection(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadline that passes after the command was sent fails the wait for its reply at once
    (counted once) and closes the connection, so the reply still due reaches nobody."""
    key = unique("sent")
    keys.append(key)
    client = from_url(redis_url, socket_timeout=None)
    try:
        first_id = client.client_id()
        _send_then_outlive_the_deadline(monkeypatch, redis.Connection)
        with tb.inherit_deadline(tb.Deadline.after(0.05)):
            with pytest.raises(tb.DeadlineExceeded):
                client.incr(key)
        monkeypatch.undo()
        assert counters.get("cancelled-by-deadline", component="redis") == 1
        # The write went out before the deadline and stands; the next reply is its own.
        assert client.get(key) == b"1"
        assert client.client_id() != first_id
    finally:
        client.close()


@pytest.mark.asyncio_real
async def test_async_deadline_spent_between_send_and_read_closes_the_connection(
    redis_url: str, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio: a deadline that passes after the send fails the wait for the reply at once and
    closes the connection; the next command reads its own reply."""
    key = unique("asent")
    keys.append(key)
    client = afrom_url(redis_url, socket_timeout=None)
    try:
        first_id = await client.client_id()
        _send_then_outlive_the_deadline(monkeypatch, redis.asyncio.Connection)
        with tb.inherit_deadline(tb.Deadline.after(0.05)):
            with pytest.raises(tb.DeadlineExceeded):
                await client.incr(key)
        monkeypatch.undo()
        assert counters.get("cancelled-by-deadline", component="redis") == 1
        assert await client.get(key) == b"1"
        assert await client.client_id() != first_id
    finally:
        await client.aclose()
