"""Deferred writes (Tx.defer): batched by statement, never reordered for one row, never lost."""

from __future__ import annotations

from typing import Any

import pytest

from timebound._store import Tx, open_store

pytestmark = pytest.mark.asyncio_real

INSERT = "INSERT INTO tb_timers (key, kind, stream, due_ms, priority) VALUES (?, 'run', 's', ?, 0)"
MOVE = "UPDATE tb_timers SET due_ms = ? WHERE key = ?"
UPSERT = INSERT + " ON CONFLICT (key) DO UPDATE SET due_ms = excluded.due_ms"
READ = "SELECT due_ms FROM tb_timers WHERE key = ?"


def _count_calls(tx: Tx) -> list[tuple[str, int]]:
    """Record each statement the transaction sends to the backend, with its row count."""
    calls: list[tuple[str, int]] = []
    execute, execute_many = tx._execute, tx._execute_many

    async def one(sql: str, *args: Any) -> int:
        calls.append((sql, 1))
        return await execute(sql, *args)

    async def many(sql: str, rows: list[tuple[Any, ...]]) -> None:
        calls.append((sql, len(rows)))
        await execute_many(sql, rows)

    tx._execute, tx._execute_many = one, many  # type: ignore[method-assign]
    return calls


async def _due(store: Any, key: str) -> int | None:
    async with store.transaction() as tx:
        row = await tx.fetchone(READ, key)
    return None if row is None else int(row["due_ms"])


async def test_writes_of_one_statement_go_as_one_batch(store_url: str) -> None:
    """Interleaved deferred writes of two statements on distinct rows are sent as two batches."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            calls = _count_calls(tx)
            for i in range(3):
                tx.defer(("t", f"a{i}"), INSERT, f"a{i}", i)
                tx.defer(("t", f"b{i}"), INSERT.replace("'run'", "'token'"), f"b{i}", 10 + i)
        assert [n for _, n in calls] == [3, 3]
        assert [await _due(store, k) for k in ("a0", "a2", "b0", "b2")] == [0, 2, 10, 12]
    finally:
        await store.close()


async def test_one_rows_writes_keep_their_order(store_url: str) -> None:
    """A row written by two statements in turns ends with its last write, not regrouped."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            tx.defer(("t", "k"), INSERT, "k", 1)
            tx.defer(("t", "k"), MOVE, 2, "k")
            tx.defer(("t", "j"), INSERT, "j", 5)
            tx.defer(("t", "k"), UPSERT, "k", 3)
            tx.defer(("t", "k"), MOVE, 4, "k")
        assert await _due(store, "k") == 4
        assert await _due(store, "j") == 5
    finally:
        await store.close()


async def test_a_read_of_the_row_sees_its_deferred_write(store_url: str) -> None:
    """A keyed read of a row first sends the deferred writes when one touches that row."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.execute(INSERT, "k", 1)
            tx.defer(("t", "k"), MOVE, 2, "k")
            row = await tx.fetch_row(("t", "k"), READ, "k")
            assert row is not None and row["due_ms"] == 2
    finally:
        await store.close()


async def test_a_read_of_another_row_passes_deferred_writes(store_url: str) -> None:
    """A keyed read of another row leaves the deferred writes for the batch."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.execute(INSERT, "j", 7)
            calls = _count_calls(tx)
            tx.defer(("t", "k"), INSERT, "k", 1)
            row = await tx.fetch_row(("t", "j"), READ, "j")
            assert row is not None and row["due_ms"] == 7
            assert calls == []
        assert calls == [(INSERT, 1)]
        assert await _due(store, "k") == 1
    finally:
        await store.close()


async def test_any_other_statement_sees_every_deferred_write(store_url: str) -> None:
    """A statement that is not a keyed read sends the deferred writes first."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            tx.defer(("t", "k"), INSERT, "k", 1)
            tx.defer(("t", "j"), INSERT, "j", 2)
            rows = await tx.fetch("SELECT key FROM tb_timers ORDER BY key")
            assert [r["key"] for r in rows] == ["j", "k"]
            tx.defer(("t", "k"), MOVE, 3, "k")
            assert await tx.execute("DELETE FROM tb_timers WHERE due_ms = ?", 3) == 1
    finally:
        await store.close()


async def test_deferred_writes_of_a_rolled_back_transaction_are_not_stored(store_url: str) -> None:
    """A deferred write is stored with its transaction or not at all."""
    store = open_store(store_url)
    await store.open()
    try:
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                tx.defer(("t", "k"), INSERT, "k", 1)
                raise RuntimeError("abort")
        assert await _due(store, "k") is None
    finally:
        await store.close()


async def test_a_deferred_write_not_sent_is_rewritten(store_url: str) -> None:
    """``Tx.rewrite`` replaces a deferred write not yet sent, while nothing since may have
    changed its row (D6.36); after the write was sent, after another write of the row or after
    a statement on its table, it does nothing and says so."""
    plain = "INSERT INTO tb_timers (key, kind, stream, due_ms, priority) VALUES (?, ?, ?, ?, ?)"
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            tx.defer(("t", "a"), plain, "a", "run", "s", 1, 0)
            mark_a = tx.write_mark()
            tx.defer(("t", "b"), plain, "b", "run", "s", 2, 0)
            mark_b = tx.write_mark()
            tx.defer(("t", "c"), plain, "c", "run", "s", 3, 0)
            mark_c = tx.write_mark()
            tx.defer(("t", "b"), MOVE, 20, "b")  # b written again since its mark
            assert tx.rewrite(("t", "a"), mark_a, plain, "a", "run", "s", 10, 0)
            assert not tx.rewrite(("t", "b"), mark_b, plain, "b", "run", "s", 99, 0)
            await tx.execute(MOVE, 30, "c")  # a statement on the table: c may have changed
            assert not tx.rewrite(("t", "c"), mark_c, plain, "c", "run", "s", 99, 0)
            tx.defer(("t", "d"), plain, "d", "run", "s", 4, 0)
            mark_d = tx.write_mark()
            await tx.fetch(READ, "a")  # sends the deferred writes
            assert not tx.rewrite(("t", "d"), mark_d, plain, "d", "run", "s", 99, 0)
        assert [await _due(store, k) for k in "abcd"] == [10, 20, 30, 4]
    finally:
        await store.close()


@pytest.mark.parametrize("n", [1, 3, 4, 5, 17, 63, 64, 65, 150])
async def test_many_rows_of_an_insert_are_all_stored_in_order(store_url: str, n: int) -> None:
    """Rows of a plain INSERT sent together (SQLite: multi-row statements of fixed sizes and
    the rest one by one, D6.37) are all stored, in their order; an INSERT of 21 columns (a
    token's) stays within the parameters a statement may have."""
    events = "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)"
    wide = ", ".join(f"c{i}" for i in range(21))
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            columns = ", ".join(f"c{i} INTEGER" for i in range(21))
            await tx.execute(f"CREATE TABLE t_wide (k INTEGER PRIMARY KEY, {columns})")
            await tx.execute_many(events, [("s", f"k{i}", i, "{}") for i in range(n)])
            await tx.execute_many(
                f"INSERT INTO t_wide (k, {wide}) VALUES ({', '.join('?' * 22)})",
                [(i, *range(i, i + 21)) for i in range(n)],
            )
        async with store.read() as tx:
            stored = [(e["kind"], e["at_epoch_ms"]) for e in await tx.events("s")]
            rows = await tx.fetch("SELECT * FROM t_wide ORDER BY k")
    finally:
        await store.close()
    assert stored == [(f"k{i}", i) for i in range(n)]
    assert [tuple(r.values()) for r in rows] == [(i, *range(i, i + 21)) for i in range(n)]


async def test_a_read_of_some_rows_sends_only_writes_that_touch_them(store_url: str) -> None:
    """``Tx.fetch_rows`` leaves deferred writes of other rows unsent (so a token's INSERT can
    still be rewritten, D6.36), and sends them first when one touches a row it reads."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            calls = _count_calls(tx)
            tx.defer(("t", "a"), INSERT, "a", 1)
            assert await tx.fetch_rows([("t", "b")], READ, "b") == []
            assert calls == []
            assert await tx.fetch_rows([("t", "b"), ("t", "a")], READ, "a") == [{"due_ms": 1}]
            assert calls == [(INSERT, 1)]
    finally:
        await store.close()
