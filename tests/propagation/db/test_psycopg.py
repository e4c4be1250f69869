"""psycopg 3 (sync and async) under a deadline, against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import timebound as tb
from timebound.propagation import RequestState, _state
from timebound.propagation.psycopg import (
    AsyncDeadlineCursor,
    DeadlineCursor,
    aconnect,
    aconnection,
    connect,
    connection,
)
from timebound.telemetry import counters

from .conftest import in_request, leave_request, unique

pytestmark = pytest.mark.postgres

SETTING = "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"


@pytest.fixture
def conn(postgres_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection whose cursors obey the deadline."""
    with connect(postgres_dsn, autocommit=True) as c:
        yield c


def scalar(c: psycopg.Connection[Any], query: str) -> Any:
    row = c.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_pg_sleep_is_cancelled_by_postgres_at_the_deadline(
    conn: psycopg.Connection[Any], request_state: RequestState
) -> None:
    """``pg_sleep(10)`` under a 200 ms deadline is stopped by the server (57014); sync code is
    bounded without any client-side cancel."""
    with tb.inherit_deadline(tb.Deadline.after(0.2)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            conn.execute("SELECT pg_sleep(10)")
    assert info.value.source == "inherited"
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert info.value.__cause__.sqlstate == "57014"
    assert request_state.cancelled_by_deadline is True
    assert counters.get("cancelled-by-deadline", component="psycopg") == 1
    assert scalar(conn, "SELECT 1") == 1
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert scalar(conn, "SHOW statement_timeout") == "0"


def test_non_autocommit_connection_recovers_after_rollback(postgres_dsn: str) -> None:
    """In psycopg's default (transactional) mode the cut statement aborts the transaction;
    after the caller's rollback the connection is clean."""
    with connect(postgres_dsn) as c:
        with tb.inherit_deadline(tb.Deadline.after(0.2)):
            with pytest.raises(tb.DeadlineExceeded):
                c.execute("SELECT pg_sleep(10)")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        c.rollback()
        assert scalar(c, "SHOW statement_timeout") == "0"


def test_statement_in_an_aborted_transaction_is_not_counted_as_narrowed(
    postgres_dsn: str,
) -> None:
    """In an aborted transaction a statement under a deadline is sent as it is (it fails on its
    own) and is not counted as a call whose timeout the deadline lowered."""
    with connect(postgres_dsn) as c:
        with pytest.raises(psycopg.errors.DivisionByZero):
            c.execute("SELECT 1/0")
        with tb.inherit_deadline(tb.Deadline.after(5)):
            with pytest.raises(psycopg.errors.InFailedSqlTransaction):
                c.execute("SELECT 1")
        c.rollback()
    assert counters.get("timeout-updated-by-deadline", component="psycopg") == 0


def test_query_runs_under_the_narrowed_statement_timeout(conn: psycopg.Connection[Any]) -> None:
    """Under a 5 s deadline the statement sees ``statement_timeout`` of at most 5000 ms."""
    with tb.inherit_deadline(tb.Deadline.after(5)):
        ms = scalar(conn, SETTING)
    assert 0 < ms <= 5000
    assert counters.get("timeout-updated-by-deadline", component="psycopg") == 1


def test_without_a_deadline_the_statement_runs_alone(conn: psycopg.Connection[Any]) -> None:
    """With no deadline no transaction is wrapped around the statement (it starts its own)."""
    assert scalar(conn, "SELECT now() = statement_timestamp()") is True


def test_spent_deadline_fails_fast(
    conn: psycopg.Connection[Any], request_state: RequestState
) -> None:
    """A spent deadline raises the binding bound's error and sends nothing."""
    with tb.inherit_deadline(tb.Deadline.after(0)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            conn.execute("SELECT 1")
    assert info.value.source == "inherited"
    assert request_state.cancelled_by_deadline is True
    assert counters.get("cancelled-by-deadline", component="psycopg") == 1


def test_transactional_caller_gets_its_setting_back(postgres_dsn: str) -> None:
    """In a caller's transaction the narrowed value is undone after the statement."""
    with connect(postgres_dsn) as c:
        c.execute("SET LOCAL statement_timeout = 7000")
        with tb.inherit_deadline(tb.Deadline.after(5)):
            inside = scalar(c, SETTING)
        after = scalar(c, "SHOW statement_timeout")
        c.rollback()
    assert 0 < inside <= 5000
    assert after == "7s"


def test_setting_changed_by_the_statement_stands(postgres_dsn: str) -> None:
    """A ``SET LOCAL statement_timeout`` run under a deadline is not undone by the restore."""
    with connect(postgres_dsn) as c:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            c.execute("SET LOCAL statement_timeout = 7000")
        after = scalar(c, "SHOW statement_timeout")
        c.rollback()
    assert after == "7s"


def test_shorter_session_timeout_stays_in_force(
    conn: psycopg.Connection[Any], request_state: RequestState
) -> None:
    """A tighter session ``statement_timeout`` is kept; its cancel stays psycopg's error."""
    conn.execute("SET statement_timeout = 100")
    with tb.inherit_deadline(tb.Deadline.after(5)):
        with pytest.raises(psycopg.errors.QueryCanceled) as info:
            conn.execute("SELECT pg_sleep(10)")
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert request_state.cancelled_by_deadline is False


def test_writes_under_a_deadline_are_committed(conn: psycopg.Connection[Any]) -> None:
    """Statements in a transaction of ours are committed when they succeed."""
    table = unique("pwrites")
    conn.execute(f"CREATE TABLE {table} (id int)")
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES (%s)", [(1,), (2,)])
        with psycopg.connect(conn.info.dsn) as other:
            row = other.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row == (2,)
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def test_pool_wait_is_capped_by_the_deadline(
    postgres_dsn: str, request_state: RequestState
) -> None:
    """Waiting for the pool's only connection stops at the deadline with the binding source."""
    with ConnectionPool(
        postgres_dsn, min_size=1, max_size=1, kwargs={"cursor_factory": DeadlineCursor}
    ) as pool:
        with connection(pool):
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    with connection(pool):
                        pass
        # The held connection went back and serves the next caller.
        with connection(pool) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
    assert info.value.source == "inherited"
    assert request_state.cancelled_by_deadline is True


def test_pool_query_is_cut_and_the_connection_reused(postgres_dsn: str) -> None:
    """Through the pool: the query is cut at the deadline and the connection comes back clean."""
    with ConnectionPool(
        postgres_dsn,
        min_size=1,
        max_size=1,
        kwargs={"cursor_factory": DeadlineCursor, "autocommit": True},
    ) as pool:
        with tb.inherit_deadline(tb.Deadline.after(0.2)):
            with pytest.raises(tb.DeadlineExceeded):
                with connection(pool) as c:
                    c.execute("SELECT pg_sleep(10)")
        with connection(pool) as c:
            assert c.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert pool.get_stats().get("connections_lost", 0) == 0


def test_blocked_pool_is_left_alone_without_a_deadline(postgres_dsn: str) -> None:
    """With no deadline the pool's own timeout governs the wait (psycopg_pool's PoolTimeout)."""
    from psycopg_pool import PoolTimeout

    with ConnectionPool(postgres_dsn, min_size=1, max_size=1) as pool:
        held = pool.getconn()
        try:
            with pytest.raises(PoolTimeout):
                with connection(pool, timeout=0.05):
                    pass
        finally:
            pool.putconn(held)


@pytest.mark.asyncio_real
async def test_async_pg_sleep_is_cancelled_by_postgres(postgres_dsn: str) -> None:
    """The async cursor: ``pg_sleep(10)`` under 200 ms is cut by the server (57014)."""
    state, token = in_request()
    try:
        async with await aconnect(postgres_dsn, autocommit=True) as c:
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    await c.execute("SELECT pg_sleep(10)")
            cur = await c.execute("SHOW statement_timeout")
            assert await cur.fetchone() == ("0",)
    finally:
        leave_request(token)
    assert info.value.source == "inherited"
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert state.cancelled_by_deadline is True


@pytest.mark.asyncio_real
async def test_async_transactional_caller_gets_its_setting_back(postgres_dsn: str) -> None:
    """The async cursor puts the caller's setting back inside its transaction."""
    async with await aconnect(postgres_dsn) as c:
        await c.execute("SET LOCAL statement_timeout = 7000")
        with tb.inherit_deadline(tb.Deadline.after(5)):
            inside = await (await c.execute(SETTING)).fetchone()
        after = await (await c.execute("SHOW statement_timeout")).fetchone()
        await c.rollback()
    assert inside is not None and 0 < inside[0] <= 5000
    assert after == ("7s",)


@pytest.mark.asyncio_real
async def test_async_pool_wait_is_capped_by_the_deadline(postgres_dsn: str) -> None:
    """Waiting for the async pool's only connection stops at the deadline.

    Real time: psycopg_pool measures its waits with ``time.monotonic()`` itself, so it cannot
    run on virtual time (the exact-instant version of this rule is the asyncpg pool test).
    """
    state, token = in_request()
    pool = AsyncConnectionPool(
        postgres_dsn,
        min_size=1,
        max_size=1,
        open=False,
        kwargs={"cursor_factory": AsyncDeadlineCursor},
    )
    await pool.open(wait=True)
    try:
        async with aconnection(pool):
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    async with aconnection(pool):
                        pass
        async with aconnection(pool) as c:
            assert await (await c.execute("SELECT 1")).fetchone() == (1,)
    finally:
        leave_request(token)
        await pool.close()
    assert info.value.source == "inherited"
    assert state.cancelled_by_deadline is True


def test_sync_deadline_in_a_worker_thread(postgres_dsn: str) -> None:
    """A deadline entered in a worker thread bounds that thread's queries only."""
    results: dict[str, Any] = {}

    def worker() -> None:
        with connect(postgres_dsn, autocommit=True) as c:
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                try:
                    c.execute("SELECT pg_sleep(10)")
                except tb.DeadlineExceeded as exc:
                    results["source"] = exc.source

    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    assert results == {"source": "inherited"}


def test_attempt_timeout_cut_leaves_the_request_unmarked(
    conn: psycopg.Connection[Any], postgres_dsn: str
) -> None:
    """``pg_sleep(10)`` cut by a 200 ms attempt timeout in a request with 30 s left: the error
    says ``attempt`` and the request is not marked (it is not answered "Deadline expired")."""
    deadline = tb.Deadline.after(30)
    state = RequestState(deadline_received_ms=30_000, deadline=deadline)
    token = _state._request.set(state)
    try:
        with tb.inherit_deadline(deadline):
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.fail_after(0.2, source="attempt"):
                    conn.execute("SELECT pg_sleep(10)")
    finally:
        _state._request.reset(token)
    assert info.value.source == "attempt"
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert state.cancelled_by_deadline is False


def _cancel_caller_when_answered(
    monkeypatch: pytest.MonkeyPatch, starts: str
) -> list[asyncio.Task[Any]]:
    """Make ``psycopg.AsyncCursor.execute`` cancel the caller's task (``callers[0]``) the
    moment the server has answered a statement starting with ``starts``."""
    callers: list[asyncio.Task[Any]] = []
    base = psycopg.AsyncCursor.execute

    async def answered_then_cancelled(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        result = await base(self, query, *args, **kwargs)
        if isinstance(query, str) and query.startswith(starts) and callers:
            callers.pop().cancel()
            # The reply is in, not yet handed over: a cancel of the task running this is
            # delivered here, as if it had arrived while the reply was on its way.
            await asyncio.sleep(0)
        return result

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", answered_then_cancelled)
    return callers


@pytest.mark.asyncio_real
async def test_async_cancel_right_after_narrowing_restores_the_callers_timeout(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel landing just as the narrowing is answered in the caller's transaction: the
    caller's own ``statement_timeout`` is back in force for its next statements."""
    callers = _cancel_caller_when_answered(monkeypatch, "SELECT prev::text")
    async with await aconnect(postgres_dsn) as c:
        await c.execute("SET LOCAL statement_timeout = 7000")

        async def query() -> None:
            with tb.inherit_deadline(tb.Deadline.after(5)):
                await c.execute("SELECT 1")

        task = asyncio.ensure_future(query())
        callers.append(task)
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await (await c.execute("SHOW statement_timeout")).fetchone()
        await c.rollback()
    assert after == ("7s",)


@pytest.mark.asyncio_real
async def test_async_cancel_right_after_begin_leaves_no_transaction(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel landing just as our ``BEGIN`` is answered (autocommit connection): nothing is
    inserted, and the connection is left outside any transaction."""
    table = unique("abegin")
    callers = _cancel_caller_when_answered(monkeypatch, "BEGIN")
    async with await aconnect(postgres_dsn, autocommit=True) as c:
        await c.execute(f"CREATE TABLE {table} (id int)")
        try:

            async def insert() -> None:
                with tb.inherit_deadline(tb.Deadline.after(5)):
                    await c.execute(f"INSERT INTO {table} VALUES (1)")

            task = asyncio.ensure_future(insert())
            callers.append(task)
            with pytest.raises(asyncio.CancelledError):
                await task
            status = c.info.transaction_status
            count = await (await c.execute(f"SELECT count(*) FROM {table}")).fetchone()
        finally:
            await c.execute(f"DROP TABLE {table}")
    assert status == psycopg.pq.TransactionStatus.IDLE
    assert count == (0,)


def test_pipeline_mode_statement_runs_under_the_deadline(
    conn: psycopg.Connection[Any],
) -> None:
    """In pipeline mode (one statement per query) an autocommit statement under a deadline
    runs narrowed and leaves no transaction."""
    with conn.pipeline():
        with tb.inherit_deadline(tb.Deadline.after(5)):
            row = conn.execute(SETTING).fetchone()
    assert row is not None and 0 < row[0] <= 5000
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert scalar(conn, "SHOW statement_timeout") == "0"


@pytest.mark.asyncio_real
async def test_async_pipeline_mode_statement_runs_under_the_deadline(postgres_dsn: str) -> None:
    """The async cursor in pipeline mode: narrowed, and no transaction left."""
    async with await aconnect(postgres_dsn, autocommit=True) as c:
        async with c.pipeline():
            with tb.inherit_deadline(tb.Deadline.after(5)):
                row = await (await c.execute(SETTING)).fetchone()
        assert row is not None and 0 < row[0] <= 5000
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.asyncio_real
async def test_async_cancel_while_the_connection_goes_back_does_not_lose_it(
    postgres_dsn: str,
) -> None:
    """A cancel that lands while ``aconnection`` gives the connection back to the pool: it is
    still given back, so the pool's only connection can be taken again."""
    async with AsyncConnectionPool(
        postgres_dsn,
        min_size=1,
        max_size=1,
        kwargs={"cursor_factory": AsyncDeadlineCursor},
        open=False,
    ) as pool:
        real = pool.putconn
        giving_back = asyncio.Event()

        async def slow_putconn(conn: Any) -> None:
            giving_back.set()
            await asyncio.sleep(0.1)
            await real(conn)

        pool.putconn = slow_putconn  # type: ignore[method-assign]

        async def use() -> None:
            async with aconnection(pool) as conn:
                await conn.execute("SELECT 1")

        task = asyncio.ensure_future(use())
        await giving_back.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pool.putconn = real  # type: ignore[method-assign]
        async with aconnection(pool, timeout=5) as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)


@pytest.mark.asyncio_real
@pytest.mark.parametrize("autocommit", [True, False])
async def test_async_second_cancel_while_psycopg_cancels_keeps_the_connection(
    postgres_dsn: str, autocommit: bool
) -> None:
    """A caller cancelled twice (its ``task.cancel()``, then another while it waits for the
    statement to be cancelled): the statement is interrupted once. psycopg handles one
    interruption by cancelling the query on the server; a second one during that makes it
    close the connection (its state unknown), which lost the connection of a storm test."""
    async with (
        await aconnect(postgres_dsn, autocommit=autocommit) as c,
        await aconnect(postgres_dsn, autocommit=True) as watcher,
    ):
        pid = c.info.backend_pid

        async def sleep() -> None:
            with tb.inherit_deadline(tb.Deadline.after(30)):
                await c.execute("SELECT pg_sleep(30)")

        async def running() -> bool:
            cur = await watcher.execute(
                "SELECT state = 'active' AND query LIKE '%%pg_sleep(30)%%' "
                "FROM pg_stat_activity WHERE pid = %s",
                (pid,),
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        task = asyncio.ensure_future(sleep())
        while not await running():
            await asyncio.sleep(0.005)
        task.cancel()
        for _ in range(5):  # psycopg is now asking the server to cancel the query
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not c.closed
        if not autocommit:
            await c.rollback()
        one = await (await c.execute("SELECT 1")).fetchone()
        status = c.info.transaction_status
    assert one == (1,)
    assert status in (psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS)
