"""The engine-neutral store: URLs, migrations, durable timers, events, one SQLite writer."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from timebound._store import StoreBusy, StoreError, open_store

pytestmark = pytest.mark.asyncio_real


@pytest.mark.parametrize(
    "url",
    ["", "mysql://x/y", "sqlite://", "sqlite:///x.db?journal=off", "postgresql://h/db?schema=A;B"],
)
def test_bad_urls_are_named(url: str) -> None:
    """An unsupported or malformed store URL is a StoreError that quotes it."""
    with pytest.raises(StoreError) as info:
        open_store(url)
    assert repr(url) in str(info.value) or "non-empty" in str(info.value)


async def test_timers_come_due_in_instant_then_priority_order(store_url: str) -> None:
    """Due timers are returned earliest first, the lower priority first at one instant."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.set_timer("b", "token", "s", 1000, 1)
            await tx.set_timer("a", "run", "s", 1000, 0)
            await tx.set_timer("c", "token", "s", 999, 1)
            await tx.set_timer("later", "token", "s", 5000, 0)
        async with store.transaction() as tx:
            due = [t["key"] for t in await tx.due_timers(1000)]
            assert await tx.next_timer_ms() == 999
    finally:
        await store.close()
    assert due == ["c", "a", "b"]


async def test_rearming_a_timer_moves_it(store_url: str) -> None:
    """Setting a timer again under its key replaces its instant."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.set_timer("k", "token", "s", 1000)
            await tx.set_timer("k", "token", "s", 3000)
            assert await tx.due_timers(2000) == []
            assert await tx.next_timer_ms() == 3000
    finally:
        await store.close()


async def test_events_of_a_rolled_back_transaction_are_not_stored(store_url: str) -> None:
    """An event is stored with its transaction's changes or not at all."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.append_event("s", "kept", 1, n=1)
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await tx.append_event("s", "dropped", 2, n=2)
                raise RuntimeError("roll back")
        async with store.transaction() as tx:
            events = await tx.events("s")
    finally:
        await store.close()
    assert events == [{"kind": "kept", "at_epoch_ms": 1, "n": 1}]


async def test_migrations_run_once(store_url: str) -> None:
    """Opening a store twice applies the migration history once."""
    for _ in range(2):
        store = open_store(store_url)
        await store.open()
        async with store.transaction() as tx:
            rows = await tx.fetch("SELECT version FROM tb_schema ORDER BY version")
        await store.close()
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1))


async def test_second_sqlite_writer_gets_store_busy(tmp_path: Path) -> None:
    """A second process-level writer on one SQLite file is refused at once."""
    first = open_store(f"sqlite:///{tmp_path}/s.db")
    await first.open()
    try:
        with pytest.raises(StoreBusy):
            await open_store(f"sqlite:///{tmp_path}/s.db").open()
    finally:
        await first.close()
    again = open_store(f"sqlite:///{tmp_path}/s.db")
    await again.open()  # the lock was released with the first store
    await again.close()


async def test_reads_see_commits_and_refuse_writes(store_url: str) -> None:
    """A read snapshot sees what was committed before it and cannot write."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.append_event("s", "kept", 1, n=1)
        async with store.read() as tx:
            events = await tx.events("s")
        with pytest.raises(Exception, match=r"(?i)read-?only"):
            async with store.read() as tx:
                await tx.execute("DELETE FROM tb_events")
        async with store.read() as tx:
            assert await tx.events("s") == events
    finally:
        await store.close()
    assert events == [{"kind": "kept", "at_epoch_ms": 1, "n": 1}]


async def test_a_read_does_not_wait_for_an_open_write(store_url: str) -> None:
    """While a write transaction is open and uncommitted, a read answers at once from the last
    commit (the WAL reader, a pooled PostgreSQL connection): API reads never queue behind the
    engine's writes."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.append_event("s", "before", 1)
        async with store.transaction() as tx:
            await tx.execute(
                "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)",
                "s",
                "uncommitted",
                2,
                "{}",
            )
            async with asyncio.timeout(10):  # a read that waited for this commit would hang
                async with store.read() as reader:
                    seen = [e["kind"] for e in await reader.events("s")]
    finally:
        await store.close()
    assert seen == ["before"]


async def test_run_pages_use_indexes_and_events_only_the_stream_index(tmp_path: Path) -> None:
    """The runs page (newest first, by status) is read through migration 3's indexes, not by
    scanning and sorting every row; the event log keeps only the index its readers use, by
    stream (D6.37: the metrics read tallies, D8.12, and an index by kind cost every event)."""
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    await store.open()
    try:
        async with store.read() as tx:
            plans = {
                name: " ".join(
                    r["detail"] for r in await tx.fetch(f"EXPLAIN QUERY PLAN {sql}", *args)
                )
                for name, sql, args in (
                    ("page", "SELECT id FROM tb_wf_runs ORDER BY started_at DESC, id DESC", ()),
                    (
                        "status",
                        "SELECT id FROM tb_wf_runs WHERE status = ? "
                        "ORDER BY started_at DESC, id DESC",
                        ("running",),
                    ),
                    (
                        "events",
                        "SELECT kind, at_ms, data FROM tb_events WHERE stream = ? ORDER BY seq",
                        ("r",),
                    ),
                )
            }
            indexes = [
                r["name"]
                for r in await tx.fetch(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
                    "AND sql IS NOT NULL",
                    "tb_events",
                )
            ]
    finally:
        await store.close()
    assert "tb_wf_runs_started" in plans["page"] and "TEMP B-TREE" not in plans["page"], plans
    assert "tb_wf_runs_status" in plans["status"] and "TEMP B-TREE" not in plans["status"], plans
    assert "tb_events_stream" in plans["events"] and "TEMP B-TREE" not in plans["events"], plans
    assert indexes == ["tb_events_stream"]


async def test_a_store_leaves_sqlite3s_process_wide_adapters_alone(tmp_path: Path) -> None:
    """``sqlite3.adapters`` is one registry for the whole process, the application's too: a
    store never registers in it (D6.37), and binds ``None`` as NULL and ``bool`` as 0/1."""
    before = dict(sqlite3.adapters)
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.execute("CREATE TABLE t (a, b, c)")
            await tx.execute("INSERT INTO t VALUES (?, ?, ?)", None, True, 7)
            row = await tx.fetchone("SELECT a IS NULL AS n, typeof(b) AS b, b AS v FROM t")
    finally:
        await store.close()
    assert sqlite3.adapters == before
    assert row == {"n": 1, "b": "integer", "v": 1}
