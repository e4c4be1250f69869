"""An http_request node against a hostile downstream in a process of its own (D6.21): a 2 GiB
answer fails the node as too-large with memory bounded; a silent one ends at the node's deadline."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deferred._hostile_server import hostile_server
from timebound import workflow as wf

pytestmark = pytest.mark.asyncio_real


@pytest.fixture
def peer() -> Iterator[str]:
    with hostile_server() as url:
        yield url


def _definition(url: str, timeout_ms: int, **implementation: Any) -> dict[str, Any]:
    return {
        "id": "http",
        "initial_node": "A",
        "actions": [{"id": "call", "kind": "http_request",
                     "implementation": {"method": "GET", "url": url, **implementation}}],
        "nodes": [{"id": "A", "action_id": "call", "timeout_ms": timeout_ms, "max_retries": 0}],
    }  # fmt: skip


async def _run(tmp_path: Path, definition: dict[str, Any]) -> wf.RunResult:
    engine = wf.Engine(db=f"sqlite:///{tmp_path}/runs.db")
    engine.register(definition)
    async with engine:
        run_id = await engine.start("http", {"q": 1})
        return await asyncio.wait_for(engine.wait(run_id), 60)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def test_a_2_gib_answer_fails_the_node_at_the_default_cap(peer: str, tmp_path: Path) -> None:
    """A downstream answering 2 GiB fails the node with too-large at 4 MiB; memory stays low."""
    before = _peak_rss_mib()
    result = await _run(tmp_path, _definition(f"{peer}/huge", 30_000))
    assert result.status == "failed"
    assert "too-large" in (result.error or "") and "4194304 bytes" in (result.error or "")
    assert _peak_rss_mib() - before < 200  # coarse: the whole answer would be 2,048 MiB


async def test_the_cap_is_set_per_action(peer: str, tmp_path: Path) -> None:
    """implementation.max_response_bytes sets the cap the answer is read with."""
    result = await _run(tmp_path, _definition(f"{peer}/huge", 30_000, max_response_bytes=1024))
    assert result.status == "failed" and "1024 bytes" in (result.error or "")


async def test_a_silent_downstream_ends_at_the_nodes_deadline(peer: str, tmp_path: Path) -> None:
    """A downstream that never answers is cut at the node's deadline."""
    result = await _run(tmp_path, _definition(f"{peer}/silent", 300))
    assert result == wf.RunResult("failed", None, "node 'A' timed out after 300ms")
