"""The run list's filters against a real host on SQLite and PostgreSQL: the bound that fired
(whatever the status), the time range, the run id and an input field."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from .conftest import Server, launch, stop


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    args = ["--db", request.getfixturevalue("pg_url")] if request.param == "postgres" else []
    server = launch(tmp_path, *args)
    yield server
    stop(server)


def _ids(server: Server, **params: str) -> set[str]:
    r = server.client.get("/v1/runs", params=params)
    assert r.status_code == 200, r.text
    return {run["id"] for run in r.json()["runs"]}


def test_filters_find_what_an_operator_asks_for(served: Server) -> None:
    """bound=node finds the failed run a node timeout ended (status=timed_out does not);
    the time range, the id prefix and an input field each narrow the list exactly."""
    node_cut = served.start("bounded", {"sleep_s": 30, "team": "blue"})
    fine = served.start("quick", {"team": "red", "n": 3})
    cut_at = served.wait_run(node_cut)["run"]
    served.wait_run(fine)
    assert cut_at["status"] == "failed"
    assert node_cut not in _ids(served, status="timed_out")
    assert _ids(served, bound="node") == {node_cut}
    assert _ids(served, bound="any") == {node_cut}
    assert _ids(served, bound="workflow") == set()
    assert _ids(served, q=fine[:6]) == {fine}
    assert _ids(served, input="team=blue") == {node_cut}
    assert _ids(served, input="n=3") == {fine}
    assert _ids(served, input="n=4") == set()
    start = cut_at["started_at"]
    assert _ids(served, since=str(start), until=str(start + 1)) == {node_cut}
    iso = datetime.fromtimestamp(start / 1000, UTC).isoformat(timespec="milliseconds")
    assert node_cut in _ids(served, since=iso.replace("+00:00", ""))
    assert _ids(served, until=str(start)) == set()
    # The old name of the node layer still filters, with a Deprecation header (D2.7).
    old = served.client.get("/v1/runs", params={"bound": "execution"})
    assert old.status_code == 200 and {r["id"] for r in old.json()["runs"]} == {node_cut}
    assert old.headers["Deprecation"] == "true"
    assert "bound=node" in old.headers["X-Timebound-Deprecated"]
    assert "Deprecation" not in served.client.get("/v1/runs", params={"bound": "node"}).headers


@pytest.mark.parametrize(
    "params",
    [{"bound": "nap"}, {"since": "yesterday"}, {"input": "novalue"}, {"input": "=3"}],
)
def test_bad_filters_are_400_naming_the_parameter(host: Server, params: dict[str, str]) -> None:
    """A filter the host cannot read answers 400 naming it."""
    r = host.client.get("/v1/runs", params=params)
    assert r.status_code == 400 and next(iter(params)) in r.json()["detail"]
