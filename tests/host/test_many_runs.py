"""A store with 10,000 runs: the API and the UI page through them, a page at a time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from .conftest import QUICK, launch, stop

RUNS = 10_000


async def _fill(db: str) -> None:
    from timebound import workflow as wf

    def noop(ctx: Any) -> None:
        return None

    definition = {**QUICK, "id": "many"}
    definition["actions"] = [
        {"id": "work", "kind": "python", "implementation": {"handler": "noop"}}
    ]
    engine = wf.Engine(db=db, actions={"noop": noop})
    engine.register(definition)
    async with engine:
        # Started together: the engine commits concurrent starts in shared transactions.
        ids = await asyncio.gather(*(engine.start("many") for _ in range(RUNS)))
        await engine.cancel(ids[0])  # one run whose state differs, for the filter
    assert len(set(ids)) == RUNS


def test_ten_thousand_runs_are_served_a_page_at_a_time(tmp_path: Path) -> None:
    """Both the API and /ui/ answer one page (50 rows) with a next cursor, and a status filter
    finds the one cancelled run among 10,000."""
    asyncio.run(_fill(f"sqlite:///{tmp_path}/host.db"))
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "many.json").write_text(
        json.dumps(
            {
                **QUICK,
                "id": "many",
                # Another body than the stored version 1's: a new body needs a new version.
                "version": 2,
                "actions": [
                    {"id": "work", "kind": "python", "implementation": {"handler": "work"}}
                ],
            }
        )
    )
    server = launch(tmp_path)
    try:
        page = server.client.get("/v1/runs", params={"definition": "many"}).json()
        assert len(page["runs"]) == 50 and page["next_cursor"] is not None
        ui = server.client.get("/ui/")
        assert ui.status_code == 200
        assert ui.text.count('<td><a href="/ui/runs/') == 50
        assert 'rel="next"' in ui.text
        cancelled = server.client.get("/v1/runs", params={"status": "cancelled"}).json()
        assert [r["status"] for r in cancelled["runs"]] == ["cancelled"]
    finally:
        stop(server)
