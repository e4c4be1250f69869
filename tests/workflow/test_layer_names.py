"""One name per layer (D2.7): the node layer is ``node`` in memory, in stored rows and in filters;
a store written with the old name ``execution`` is renamed by its migration."""

from __future__ import annotations

import warnings

import pytest

from timebound._store import open_store
from timebound._store._migrations import MIGRATIONS

from .test_engine import HANDLERS, by_kind, definition, run

# The migration that renames the layer: the one whose statements mention it.
(RENAME,) = [v for v, statements in MIGRATIONS if any("execution_timeout" in s for s in statements)]


async def _age(store_url: str, run_id: str) -> None:
    """Make the store look as a release before the rename left it: the run's rows say
    ``execution``, a user's output holds the same text in a string, the migration not applied."""
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            for table, column, old, new in (
                ("tb_events", "data", '"timeout_type": "node"', '"timeout_type": "execution"'),
                (
                    "tb_wf_tokens",
                    "state_data",
                    '"reason": "node_timeout"',
                    '"reason": "execution_timeout"',
                ),
            ):
                changed = await tx.execute(
                    f"UPDATE {table} SET {column} = REPLACE({column}, ?, ?)", old, new
                )
                assert changed
            await tx.append_event(
                run_id, "note", 1, text='"timeout_type": "execution"', reason="execution_timeout"
            )
            # What else the migration adds, so it runs again as on a store it never saw.
            await tx.execute("ALTER TABLE tb_deferred_ops DROP COLUMN expires_set_by")
            await tx.execute("DELETE FROM tb_schema WHERE version >= ?", RENAME)
    finally:
        await store.close()


async def test_a_node_timeout_is_stored_as_the_node_layer(virtual_clock, make_engine) -> None:
    """The event, the token's reason and the run filter all say ``node``."""
    d = definition([{"id": "A", "timeout_ms": 2000}])
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, _ = await run(engine, {"A": 60})
        (event,) = by_kind(await engine.events(run_id), "token_timed_out")
        _, tokens, _ = await engine.snapshot(run_id)
        found = await engine.list_runs(bound="node")
    assert result.status == "failed"
    assert event["timeout_type"] == "node"
    assert tokens[0]["state_data"]["reason"] == "node_timeout"
    assert [r["id"] for r in found] == [run_id]


async def test_the_migration_renames_rows_stored_as_execution(
    virtual_clock, make_engine, store_url: str
) -> None:
    """A store whose node timeouts say ``execution`` reads as ``node`` once opened: the events,
    the token's reason and the filter; a string that merely holds the old text is left alone;
    ``bound="execution"`` still filters, with a DeprecationWarning naming ``node``."""
    d = definition([{"id": "A", "timeout_ms": 2000}])
    async with make_engine(HANDLERS, d) as engine:
        run_id, _, _ = await run(engine, {"A": 60})
    await _age(store_url, run_id)
    async with make_engine(HANDLERS, d) as engine:
        events = await engine.events(run_id)
        _, tokens, _ = await engine.snapshot(run_id)
        found = await engine.list_runs(bound="node")
        with pytest.warns(DeprecationWarning, match="'node'"):
            old = await engine.list_runs(bound="execution")
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            assert await engine.list_runs(bound="workflow") == []
    (timed_out,) = by_kind(events, "token_timed_out")
    (note,) = by_kind(events, "note")
    assert timed_out["timeout_type"] == "node"
    assert tokens[0]["state_data"]["reason"] == "node_timeout"
    assert (note["text"], note["reason"]) == ('"timeout_type": "execution"', "execution_timeout")
    assert [r["id"] for r in found] == [r["id"] for r in old] == [run_id]
