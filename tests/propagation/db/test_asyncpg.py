"""asyncpg under a deadline, against the real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

import timebound as tb
from timebound.propagation.asyncpg import DeadlineConnection, DeadlinePool, connect, create_pool
from timebound.telemetry import counters
from timebound.testing import VirtualClock

from .conftest import in_request, leave_request, unique

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio_real]


class QueryLog:
    """Every statement asyncpg runs on a connection (its query logger)."""

    def __init__(self, con: Any) -> None:
        self.queries: list[str] = []
        con.add_query_logger(lambda record: self.queries.append(record.query))


async def test_pg_sleep_is_cancelled_by_postgres_at_the_deadline(postgres_dsn: str) -> None:
    """``pg_sleep(10)`` under a 200 ms deadline is stopped by the server (57014)."""
    con = await connect(postgres_dsn)
    state, token = in_request()
    try:
        with tb.inherit_deadline(tb.Deadline.after(0.2)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                await con.fetchval("SELECT pg_sleep(10)")
        assert info.value.source == "inherited"
        assert isinstance(info.value.__cause__, asyncpg.QueryCanceledError)
        assert info.value.__cause__.sqlstate == "57014"
        assert state.cancelled_by_deadline is True
        assert counters.get("cancelled-by-deadline", component="asyncpg") == 1
        # The connection is usable and clean: no transaction, no changed setting.
        assert await con.fetchval("SELECT 1") == 1
        assert con.is_in_transaction() is False
        assert await con.fetchval("SHOW statement_timeout") == "0"
    finally:
        leave_request(token)
        await con.close()


async def test_query_runs_under_the_narrowed_statement_timeout(postgres_dsn: str) -> None:
    """Under a 5 s deadline the statement sees ``statement_timeout`` of at most 5000 ms."""
    con = await connect(postgres_dsn)
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            ms = await con.fetchval(
                "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
            )
        assert 0 < ms <= 5000
        assert counters.get("timeout-updated-by-deadline", component="asyncpg") == 1
    finally:
        await con.close()


async def test_without_a_deadline_nothing_is_added(postgres_dsn: str) -> None:
    """With no deadline the query runs alone: no transaction, no setting, no extra statement."""
    con = await connect(postgres_dsn)
    log = QueryLog(con)
    try:
        assert await con.fetchval("SELECT 41 + 1") == 42
    finally:
        await con.close()
    assert log.queries == ["SELECT 41 + 1"]


async def test_spent_deadline_fails_fast_and_sends_nothing(postgres_dsn: str) -> None:
    """A spent deadline raises the binding bound's error before anything is sent."""
    con = await connect(postgres_dsn)
    log = QueryLog(con)
    state, token = in_request()
    try:
        with tb.inherit_deadline(tb.Deadline.after(0)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                await con.fetchval("SELECT 1")
    finally:
        leave_request(token)
        await con.close()
    assert info.value.source == "inherited"
    assert log.queries == []
    assert state.cancelled_by_deadline is True


async def test_shorter_session_timeout_stays_in_force(postgres_dsn: str) -> None:
    """A session ``statement_timeout`` tighter than the deadline is kept, and its cancel is
    asyncpg's own error, not a deadline."""
    con = await connect(postgres_dsn)
    state, token = in_request()
    try:
        await con.execute("SET statement_timeout = 100")
        with tb.inherit_deadline(tb.Deadline.after(5)):
            with pytest.raises(asyncpg.QueryCanceledError) as info:
                await con.fetchval("SELECT pg_sleep(10)")
        assert not isinstance(info.value, tb.DeadlineExceeded)
        assert state.cancelled_by_deadline is False
        assert await con.fetchval("SHOW statement_timeout") == "100ms"
    finally:
        leave_request(token)
        await con.close()


async def test_callers_transaction_gets_its_setting_back(postgres_dsn: str) -> None:
    """Inside the caller's transaction the narrowed value is undone right after the statement."""
    con = await connect(postgres_dsn)
    try:
        async with con.transaction():
            await con.execute("SET LOCAL statement_timeout = 7000")
            with tb.inherit_deadline(tb.Deadline.after(5)):
                inside = await con.fetchval(
                    "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
                )
            after = await con.fetchval("SHOW statement_timeout")
        assert 0 < inside <= 5000
        assert after == "7s"
    finally:
        await con.close()


async def test_enclosing_scope_is_reported_as_the_source(postgres_dsn: str) -> None:
    """When an attempt scope is the binding bound, the error says ``attempt``."""
    con = await connect(postgres_dsn)
    try:
        with tb.inherit_deadline(tb.Deadline.after(30)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.fail_after(0.2, source="attempt"):
                    await con.fetchval("SELECT pg_sleep(10)")
        assert info.value.source == "attempt"
        assert await con.fetchval("SELECT 1") == 1
    finally:
        await con.close()


async def test_writes_under_a_deadline_are_committed(postgres_dsn: str) -> None:
    """Statements run in a transaction of ours are committed when they succeed."""
    table = unique("writes")
    con = await connect(postgres_dsn)
    try:
        await con.execute(f"CREATE TABLE {table} (id int)")
        with tb.inherit_deadline(tb.Deadline.after(5)):
            await con.executemany(f"INSERT INTO {table} VALUES ($1)", [(1,), (2,)])
            await con.execute(f"INSERT INTO {table} VALUES ($1)", 3)
        other = await asyncpg.connect(postgres_dsn)
        try:
            assert await other.fetchval(f"SELECT count(*) FROM {table}") == 3
        finally:
            await other.close()
    finally:
        await con.execute(f"DROP TABLE IF EXISTS {table}")
        await con.close()


async def test_callers_transaction_is_not_split(postgres_dsn: str) -> None:
    """A caller's transaction opened under a deadline stays one transaction (rollback undoes
    every statement)."""
    table = unique("tx")
    con = await connect(postgres_dsn)
    try:
        await con.execute(f"CREATE TABLE {table} (id int)")
        with tb.inherit_deadline(tb.Deadline.after(5)):
            tx = con.transaction()
            await tx.start()
            await con.execute(f"INSERT INTO {table} VALUES ($1)", 1)
            await tx.rollback()
        assert await con.fetchval(f"SELECT count(*) FROM {table}") == 0
    finally:
        await con.execute(f"DROP TABLE IF EXISTS {table}")
        await con.close()


async def test_pool_query_is_cut_and_the_connection_reused(postgres_dsn: str) -> None:
    """Through the pool: the query is cut at the deadline, the one connection is reused clean."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        with tb.inherit_deadline(tb.Deadline.after(0.2)):
            with pytest.raises(tb.DeadlineExceeded):
                await pool.fetchval("SELECT pg_sleep(10)")
        async with pool.acquire() as con:
            assert await con.fetchval("SHOW statement_timeout") == "0"
        assert pool.pool.get_size() == 1
    finally:
        await pool.close()


async def test_pool_fails_fast_when_the_deadline_is_spent(postgres_dsn: str) -> None:
    """``acquire()`` under a spent deadline raises at once, with the binding source."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
    state, token = in_request()
    try:
        with tb.inherit_deadline(tb.Deadline.after(0), source="inherited"):
            with pytest.raises(tb.DeadlineExceeded) as info:
                async with pool.acquire():
                    pass
    finally:
        leave_request(token)
        await pool.close()
    assert info.value.source == "inherited"
    assert state.cancelled_by_deadline is True


async def test_pool_needs_the_deadline_connection_class(postgres_dsn: str) -> None:
    """A pool of plain connections is refused, naming the fix."""
    raw = await asyncpg.create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        with pytest.raises(tb.ConfigurationError, match="connection_class=DeadlineConnection"):
            DeadlinePool(raw)
    finally:
        await raw.close()


def test_pool_wait_ends_exactly_at_the_deadline(postgres_dsn: str) -> None:
    """Waiting for the pool's only connection stops at the deadline, on virtual time."""
    # Real sockets are involved: let real I/O settle for 0.2 s before virtual time jumps.
    clock = VirtualClock(100.0, autojump_threshold=0.2)

    async def main() -> tuple[float, str]:
        pool = await create_pool(postgres_dsn, min_size=1, max_size=1)
        try:
            async with pool.acquire():
                start = clock.now()
                with tb.inherit_deadline(tb.Deadline.after(0.25)):
                    with pytest.raises(tb.DeadlineExceeded) as info:
                        await pool.fetchval("SELECT 1")
                return clock.now() - start, info.value.source
        finally:
            await pool.close()

    waited, source = clock.run(main())
    assert waited == 0.25
    assert source == "inherited"


async def test_connection_class_must_be_ours(postgres_dsn: str) -> None:
    """``connect(connection_class=...)`` accepts only DeadlineConnection subclasses."""
    with pytest.raises(tb.ConfigurationError):
        await connect(postgres_dsn, connection_class=asyncpg.Connection)

    class Mine(DeadlineConnection):
        pass

    con = await connect(postgres_dsn, connection_class=Mine)
    try:
        assert isinstance(con, Mine)
    finally:
        await con.close()


async def test_cancellation_is_never_converted(postgres_dsn: str) -> None:
    """An explicit cancel of the caller stays a CancelledError and the connection recovers."""
    con = await connect(postgres_dsn)
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            task = asyncio.ensure_future(con.fetchval("SELECT pg_sleep(10)"))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert await con.fetchval("SELECT 1") == 1
        assert await con.fetchval("SHOW statement_timeout") == "0"
    finally:
        await con.close()


async def test_setting_changed_by_the_statement_stands(postgres_dsn: str) -> None:
    """A ``SET LOCAL statement_timeout`` run under a deadline is not undone by the restore."""
    con = await connect(postgres_dsn)
    try:
        async with con.transaction():
            with tb.inherit_deadline(tb.Deadline.after(5)):
                await con.execute("SET LOCAL statement_timeout = 7000")
            after = await con.fetchval("SHOW statement_timeout")
        assert after == "7s"
    finally:
        await con.close()


async def test_span_tags_report_timeout_and_cancel(postgres_dsn: str) -> None:
    """The narrowed timeout and the cut are reported as ``timeout_ms``/``cancelled_by_deadline``."""
    from timebound.telemetry import Event, add_listener

    seen: list[Event] = []
    remove = add_listener(seen.append)
    con = await connect(postgres_dsn)
    try:
        with tb.inherit_deadline(tb.Deadline.after(0.2)):
            with pytest.raises(tb.DeadlineExceeded):
                await con.fetchval("SELECT pg_sleep(10)")
    finally:
        remove()
        await con.close()
    tags = [e.attrs for e in seen if e.name == "span.tags" and e.attrs["component"] == "asyncpg"]
    assert 0 < tags[0]["timeout_ms"] <= 200
    assert tags[1] == {"component": "asyncpg", "cancelled_by_deadline": 1}


async def test_pool_shortcuts_run_under_the_deadline(postgres_dsn: str) -> None:
    """The pool's ``executemany``/``fetchrow``/``fetchval`` run narrowed; the writes commit."""
    table = unique("poolw")
    async with await create_pool(postgres_dsn, min_size=1, max_size=1) as pool:
        await pool.execute(f"CREATE TABLE {table} (v int)")
        try:
            with tb.inherit_deadline(tb.Deadline.after(5)):
                await pool.executemany(f"INSERT INTO {table} VALUES ($1)", [(1,), (2,)])
                row = await pool.fetchrow(f"SELECT count(*) AS n, sum(v) AS s FROM {table}")
                ms = await pool.fetchval(
                    "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
                )
            assert (row["n"], row["s"]) == (2, 3)
            assert 0 < ms <= 5000
            assert counters.get("timeout-updated-by-deadline", component="asyncpg") == 3
        finally:
            await pool.execute(f"DROP TABLE {table}")
        assert not pool.pool.is_closing()
    assert pool.pool.is_closing()  # leaving ``async with`` closes the pool


async def test_awaited_acquire_is_bounded_and_released(postgres_dsn: str) -> None:
    """``await pool.acquire()`` on an exhausted pool ends at the deadline; ``release`` frees it."""
    async with await create_pool(postgres_dsn, min_size=1, max_size=1) as pool:
        con = await pool.acquire()
        with tb.inherit_deadline(tb.Deadline.after(0.1)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                await pool.acquire()
        assert info.value.source == "inherited"
        await pool.release(con)
        with tb.inherit_deadline(tb.Deadline.after(5)):
            assert await pool.fetchval("SELECT 1") == 1


async def test_tighter_setting_in_callers_transaction_needs_no_restore(postgres_dsn: str) -> None:
    """In a transaction whose own timeout is tighter, the statement runs under it, unrestored."""
    con = await connect(postgres_dsn)
    log = QueryLog(con)
    try:
        async with con.transaction():
            await con.execute("SET LOCAL statement_timeout = 100")
            with tb.inherit_deadline(tb.Deadline.after(5)):
                inside = await con.fetchval(
                    "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
                )
            after = await con.fetchval("SHOW statement_timeout")
        assert (inside, after) == (100, "100ms")
        assert not [q for q in log.queries if q.startswith("SELECT set_config")]
    finally:
        await con.close()


def _cancel_caller_when_answered(
    monkeypatch: pytest.MonkeyPatch, method: str, starts: str
) -> list[asyncio.Task[Any]]:
    """Make ``asyncpg.Connection.<method>`` cancel the caller's task (``callers[0]``) the moment
    the server has answered a statement starting with ``starts`` — the instant a deadline
    firing during our bookkeeping lands."""
    callers: list[asyncio.Task[Any]] = []
    base = getattr(asyncpg.Connection, method)

    async def answered_then_cancelled(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        result = await base(self, query, *args, **kwargs)
        if query.startswith(starts) and callers:
            callers.pop().cancel()
            # The reply is in, not yet handed over: a cancel of the task running this is
            # delivered here, as if it had arrived while the reply was on its way.
            await asyncio.sleep(0)
        return result

    monkeypatch.setattr(asyncpg.Connection, method, answered_then_cancelled)
    return callers


async def test_cancel_right_after_begin_leaves_no_transaction(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel landing just as our ``BEGIN`` is answered: the insert is not reported, the
    connection is left outside any transaction, and the next insert on it is committed (it
    used to join the orphaned transaction and be rolled back at release)."""
    con = await connect(postgres_dsn)
    other = await asyncpg.connect(postgres_dsn)
    table = unique("begin")
    await con.execute(f"CREATE TABLE {table} (id int)")
    callers = _cancel_caller_when_answered(monkeypatch, "execute", "BEGIN")
    try:

        async def insert(i: int) -> None:
            with tb.inherit_deadline(tb.Deadline.after(5)):
                await con.execute(f"INSERT INTO {table} VALUES ($1)", i)

        task = asyncio.ensure_future(insert(1))
        callers.append(task)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert con.is_in_transaction() is False
        await insert(2)
        assert await other.fetch(f"SELECT id FROM {table}") == [(2,)]
    finally:
        await other.execute(f"DROP TABLE {table}")
        await other.close()
        await con.close()


async def test_cancel_right_after_narrowing_in_callers_transaction_restores_its_timeout(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel landing just as the narrowing is answered inside the caller's transaction: the
    caller's own ``statement_timeout`` is back in force for its next statements."""
    con = await connect(postgres_dsn)
    callers = _cancel_caller_when_answered(monkeypatch, "fetchrow", "SELECT prev::text")
    try:
        async with con.transaction():
            await con.execute("SET LOCAL statement_timeout = 7000")

            async def query() -> None:
                with tb.inherit_deadline(tb.Deadline.after(5)):
                    await con.fetchval("SELECT 1")

            task = asyncio.ensure_future(query())
            callers.append(task)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await con.fetchval("SHOW statement_timeout") == "7s"
    finally:
        await con.close()


async def test_concurrent_misuse_is_refused_without_closing_the_connection(
    postgres_dsn: str,
) -> None:
    """A second query while one is in progress on the same connection is refused by asyncpg,
    as without a deadline; the connection is not closed and the first query finishes."""
    con = await connect(postgres_dsn)
    try:
        first = asyncio.ensure_future(con.fetchval("SELECT pg_sleep(0.2), 1", column=1))
        await asyncio.sleep(0.05)
        with tb.inherit_deadline(tb.Deadline.after(5)):
            with pytest.raises(asyncpg.InterfaceError):
                await con.execute("SELECT 1")
        assert await first == 1
        assert con.is_closed() is False
    finally:
        await con.close()
