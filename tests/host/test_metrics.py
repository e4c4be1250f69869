"""/metrics: timeouts by layer with their detection lag, and deferred operations and polls, read
from the store of a real host."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from timebound.deferred import Registry

from .conftest import Server, launch, stop
from .test_deferred_ops import OP_ID, _doc


async def _plant_polled(db: str) -> None:
    async with Registry(db) as registry:
        await registry.register(_doc(OP_ID), module="reports")
        await registry.poll_failed(OP_ID, 5.0, "connector-down")
        await registry.poll_failed(OP_ID, 5.0, "connector-down")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A host of its own, so the store holds exactly this module's runs and one operation."""
    tmp = tmp_path_factory.mktemp("metrics")
    asyncio.run(_plant_polled(f"sqlite:///{tmp}/host.db"))
    server = launch(tmp)
    yield server
    stop(server)


def _samples(text: str, name: str) -> dict[str, float]:
    return {
        labels: float(value)
        for labels, value in re.findall(rf"^{name}(\{{[^}}]*\}}) (\S+)$", text, re.MULTILINE)
    }


def test_timeouts_are_counted_by_layer_with_their_detection_lag(fresh: Server) -> None:
    """A node timeout and a join timeout each count once, under their layer, with one lag."""
    node_run = fresh.start("bounded", {"sleep_s": 5})
    join_run = fresh.start("fanout", {"delays": [0, 3]})
    assert fresh.wait_run(node_run)["run"]["status"] == "failed"
    fresh.wait_run(join_run)
    text = fresh.client.get("/metrics").text
    assert _samples(text, "timebound_workflow_timeouts_total") == {
        '{layer="node",policy="fail"}': 1.0,
        '{layer="synchronization",policy="proceed_with_available"}': 1.0,
    }
    counts = _samples(text, "timebound_workflow_timeout_detection_lag_seconds_count")
    assert counts == {
        '{layer="node"}': 1.0,
        '{layer="synchronization"}': 1.0,
        '{layer="workflow"}': 0.0,
    }
    lag = _samples(text, "timebound_workflow_timeout_detection_lag_seconds_sum")
    assert lag['{layer="node"}'] >= 0 and lag['{layer="synchronization"}'] >= 0


def test_deferred_operations_by_state_and_polls(fresh: Server) -> None:
    """The planted operation counts as pending under its module, with its two polls."""
    text = fresh.client.get("/metrics").text
    assert _samples(text, "timebound_deferred_operations") == {
        '{module="reports",state="pending"}': 1.0
    }
    assert _samples(text, "timebound_deferred_polls_total") == {'{module="reports"}': 2.0}
