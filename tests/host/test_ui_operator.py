"""The operator's run pages in real headless Chromium against real hosts on SQLite and
PostgreSQL: times as read, attempts as separate bars, what a running run waits for, a live page
that updates everything, and the actions (extend, terminate, retry) with their reasons. Each
test keeps its screenshots in its temporary directory; the ones docs/host.md shows are retaken
with TIMEBOUND_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .browser import DOCS_IMG, browser, page, screenshots_wanted
from .conftest import FANOUT, Server, launch, stop

__all__ = ["browser", "page"]  # fixtures, used by name

FLAKY = {
    "id": "flaky",
    "timeout_ms": 60_000,
    "initial_node": "fetch",
    "actions": [
        {"id": "flaky", "kind": "python", "implementation": {"handler": "flaky"}},
        {"id": "work", "kind": "python", "implementation": {"handler": "work"}},
    ],
    "nodes": [
        {
            "id": "fetch",
            "action_id": "flaky",
            "retry": {"max_attempts": 3, "delay_ms": 300, "backoff": "fixed"},
        },
        {"id": "store", "action_id": "work", "timeout_ms": 30_000},
    ],
    "transitions": [{"id": "t", "from": "fetch", "to": "store"}],
}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A host on each store with the flaky definition published."""
    args: list[str] = []
    if request.param == "postgres":  # dropped at the session's end (pg_schemas)
        args = ["--db", request.getfixturevalue("pg_schemas").url()]
    server = launch(tmp_path_factory.mktemp("ui"), *args)
    assert server.client.put("/v1/definitions/flaky", json=FLAKY).status_code in (200, 201)
    yield server
    stop(server)


def _shot(page: Any, tmp_path: Path, name: str, doc: str | None = None) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    if doc is not None and screenshots_wanted():
        page.screenshot(path=str(DOCS_IMG / doc), full_page=True)


def test_retries_are_separate_bars_with_their_delays_and_times_read_locally(
    served: Server, page: Any, tmp_path: Path
) -> None:
    """Two failed attempts, two hatched delays and the attempt that worked, each with its
    duration; the attempts table names the error; instants read as local date-times."""
    run_id = served.start("flaky", {"fail": 2})
    assert served.wait_run(run_id)["run"]["status"] == "completed"
    page.goto(f"{served.url}/ui/runs/{run_id}")
    lane = page.locator(".timeline .lane").filter(has_text="fetch")
    assert lane.locator(".bar.attempt").count() == 3
    assert lane.locator(".bar.delay").count() == 2
    assert lane.locator(".bar.attempt.failed").count() == 2
    # The one duration text (D1.14): "850ms", "1.2s", "1min 5s".
    texts = lane.locator(".timeout").all_inner_texts()
    assert texts and all(re.search(r"\d(ms|s|min|h|d)\b", t) for t in texts), texts
    errors = page.locator("#attempts td.error").all_inner_texts()
    assert errors.count("RuntimeError: flaky attempt 1") == 1
    started = page.locator("dd time").first
    assert started.get_attribute("title").startswith("epoch ms ")
    assert re.search(r"ago\)$", started.inner_text())
    assert "T" not in started.inner_text()  # the local form, not the ISO text
    _shot(page, tmp_path, "retries", "host-retries.png")


def test_fan_in_waiting_is_drawn_as_waiting_and_branches_carry_their_index(
    served: Server, page: Any
) -> None:
    """Branches that arrived early wait at the join: hatched waiting bars, lanes probe[i]."""
    if served.client.put("/v1/definitions/fanout", json=FANOUT).status_code not in (200, 201):
        raise AssertionError("fanout not published")
    run_id = served.start("fanout", {"delays": [0.05, 0.3, 30]})
    served.wait_run(run_id)
    page.goto(f"{served.url}/ui/runs/{run_id}")
    labels = page.locator(".timeline .label").all_inner_texts()
    assert labels[1:4] == ["probe[0]", "probe[1]", "probe[2]"]
    waiting = page.locator(".timeline .lane").filter(has_text="probe[0]").locator(".bar.waiting")
    assert waiting.count() == 1 and "waiting at fan-in" in waiting.inner_text()


def test_a_running_run_shows_what_is_pending_and_the_page_follows_it_to_the_end(
    served: Server, page: Any, tmp_path: Path
) -> None:
    """Time left, the live node's deadline and the next timer count down; when the run ends
    the status, the actions and the timeline change without a reload."""
    run_id = served.start("quick", {"sleep_s": 2})
    page.goto(f"{served.url}/ui/runs/{run_id}")
    assert page.inner_text("#run-status") == "running"
    assert "left" in page.inner_text("#pending")
    assert page.locator("#live-nodes tbody tr").count() >= 1
    assert "run deadline" in page.inner_text("#next-timer") or "node" in page.inner_text(
        "#next-timer"
    )
    _shot(page, tmp_path, "running", "host-running.png")
    page.wait_for_selector("#run-status.completed", timeout=30_000)
    assert page.locator("#pending").count() == 0
    assert page.locator("form.cancel").count() == 0
    assert page.locator(".timeline .bar.attempt.completed").count() == 2


def test_extend_then_terminate_then_retry_from_the_page(
    served: Server, page: Any, tmp_path: Path
) -> None:
    """The forms extend the run's deadline, terminate it with a reason and retry it; the
    events name the operator and the reason."""
    run_id = served.start("quick", {"sleep_s": 30})
    page.goto(f"{served.url}/ui/runs/{run_id}")
    before = served.client.get(f"/v1/runs/{run_id}").json()["run"]["timeout_at"]
    page.fill("#extend-by", "90")
    page.fill("#extend-reason", "waiting on the vendor")
    page.click("text=Extend deadline")
    page.wait_for_url(f"**/ui/runs/{run_id}")
    after = served.client.get(f"/v1/runs/{run_id}").json()["run"]["timeout_at"]
    assert after == before + 90_000
    _shot(page, tmp_path, "extended", "host-actions.png")
    page.fill("#terminate-reason", "vendor is down")
    page.click("text=Terminate run")
    page.wait_for_url(f"**/ui/runs/{run_id}")
    page.wait_for_selector("#run-status.failed", timeout=30_000)
    assert "vendor is down" in page.inner_text("dd.error")
    page.fill("#retry-reason", "vendor is back")
    page.click("text=Retry run")
    page.wait_for_url(f"**/ui/runs/{run_id}")
    events = served.client.get(f"/v1/runs/{run_id}/events").json()["events"]
    kinds = {e["kind"]: e for e in events}
    for kind, reason in [
        ("deadline_extended", "waiting on the vendor"),
        ("run_terminated", "vendor is down"),
        ("run_retried", "vendor is back"),
    ]:
        assert kinds[kind]["reason"] == reason and kinds[kind]["operator"].startswith("ui:")
    served.client.post(f"/v1/runs/{run_id}/cancel")


def test_filters_on_the_list_page(served: Server, page: Any, tmp_path: Path) -> None:
    """Choosing bound fired = node lists the run a node timeout failed; an old link's
    bound=execution (D2.7) shows the same list with node selected."""
    run_id = served.start("bounded", {"sleep_s": 30})
    served.wait_run(run_id)
    page.goto(f"{served.url}/ui/")
    page.select_option("#bound", "node")
    page.click("text=Filter")
    page.wait_for_url("**/ui/?*bound=node*")
    links = page.locator("table.runs tbody a").all_inner_texts()
    assert run_id in links
    assert set(page.locator("table.runs tbody .badge").all_inner_texts()) == {"failed"}
    _shot(page, tmp_path, "filtered", "host-filters.png")
    page.goto(f"{served.url}/ui/?bound=execution")
    assert page.locator("table.runs tbody a").all_inner_texts() == links
    assert page.input_value("#bound") == "node"


def test_the_operator_pages_pass_axe(served: Server, page: Any) -> None:
    """axe-core (in the page, under the host's CSP) finds no serious or critical violation —
    contrast, labels, names of controls — on the list, a running run and a failed run."""
    pytest.importorskip("axe_playwright_python", reason="pip install axe-playwright-python")
    from axe_playwright_python.sync_playwright import Axe

    axe = Axe()
    running = served.start("quick", {"sleep_s": 30})
    failed = served.start("flaky", {"fail": 5})
    served.wait_run(failed)
    found = {}
    for path in ("/ui/", f"/ui/runs/{running}", f"/ui/runs/{failed}"):
        page.goto(served.url + path)
        results = axe.run(page).response["violations"]
        found[path] = [
            (v["id"], [n["target"] for n in v["nodes"]][:3])
            for v in results
            if v["impact"] in ("serious", "critical")
        ]
    # The checker works under the CSP: an input without a label is found.
    page.evaluate("document.querySelector('main').appendChild(document.createElement('input'))")
    assert "label" in {v["id"] for v in axe.run(page).response["violations"]}
    served.client.post(f"/v1/runs/{running}/cancel")
    assert found == {path: [] for path in found}


WIDE = {
    "id": "wide",
    "timeout_ms": 600_000,
    "initial_node": "start",
    "actions": [{"id": "noop", "kind": "python", "implementation": {"handler": "noop"}}],
    "nodes": [
        {"id": "start", "action_id": "noop"},
        {"id": "branch", "action_id": "noop", "timeout_ms": 60_000},
        {"id": "end", "action_id": "noop"},
    ],
    "transitions": [
        {"id": "spread", "from": "start", "to": "branch", "foreach": "input.items"},
        {
            "id": "join",
            "from": "branch",
            "to": "end",
            "synchronization": {"strategy": "all", "sibling_group": "spread"},
        },
    ],
}


def test_a_run_page_with_a_thousand_events_loads_whole(
    served: Server, page: Any, record_property: Any
) -> None:
    """A fan-out of 200 branches (over 1,000 events): its page, timeline and attempts table
    included, reaches its load event in Chromium with a lane per token, and its event list fills
    from the stream. How fast is measured by bench/ui.py (``ui_run_1000_events_ms``), not here:
    a wall-clock threshold in a test fails on a busy machine, not on a slow page."""
    assert served.client.put("/v1/definitions/wide", json=WIDE).status_code in (200, 201)
    run_id = served.start("wide", {"items": list(range(200))})
    assert served.wait_run(run_id)["run"]["status"] == "completed"
    events = len(served.client.get(f"/v1/runs/{run_id}/events").json()["events"])
    assert events >= 1000
    loads = []
    for _ in range(3):
        page.goto(f"{served.url}/ui/runs/{run_id}", timeout=60_000)
        loads.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
    record_property("ui_run_page_1000_events_load_ms", loads)
    assert page.locator(".timeline .lane").count() == 202
    page.wait_for_selector(f"#events li:nth-child({events})", timeout=60_000)
    assert all(load > 0 for load in loads), loads  # each load reached its load event


ECHO = {
    "id": "echo",
    "timeout_ms": 60_000,
    "initial_node": "rank",
    "actions": [{"id": "e", "kind": "python", "implementation": {"handler": "echo"}}],
    "nodes": [{"id": "rank", "action_id": "e"}],
}
TRACE = {
    "spans": [
        {"node_id": "src", "op": "source", "start_ms": 0, "end_ms": 2, "outcome": "ok",
         "parent": None},
        {"node_id": "score", "op": "map", "start_ms": 2, "end_ms": 9, "outcome": "ok",
         "parent": None, "deps": ["src"]},
    ],
    "wrappers": {},
}  # fmt: skip


def test_a_node_that_ran_a_pipeline_links_to_its_trace_and_back(
    served: Server, page: Any, tmp_path: Path
) -> None:
    """A node whose output is a pipeline trace links to it from the attempts table; the trace
    page draws its spans and links back to the node, with no upload."""
    assert served.client.put("/v1/definitions/echo", json=ECHO).status_code in (200, 201)
    run_id = served.start("echo", {"output": {"rows": [], "trace": TRACE}})
    assert served.wait_run(run_id)["run"]["status"] == "completed"
    page.goto(f"{served.url}/ui/runs/{run_id}")
    page.click("a.trace-link")
    page.wait_for_url(f"**/ui/runs/{run_id}/trace/*")
    assert page.locator("#trace-timeline .lane").count() == 2
    assert page.locator("form.trace-form").count() == 0
    _shot(page, tmp_path, "run-trace")
    page.click("#trace-source a")
    page.wait_for_url(f"**/ui/runs/{run_id}#token-*")
    missing = served.client.get(f"/ui/runs/{run_id}/trace/nope")
    assert missing.status_code == 404
