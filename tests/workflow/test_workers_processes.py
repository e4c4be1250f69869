"""Many processes on one PostgreSQL store: ``timebound serve --no-worker`` hosts and
``timebound worker`` processes. A cancellation, a join's decision and a dead worker cross
processes within seconds, not at the node's deadline or the lease's end; a worker claims only
what it can run (D6.14, D6.15, D6.16)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
ACTIONS = "tests.workflow._workers_actions"


def _flow(
    fid: str,
    nodes: list[dict[str, Any]],
    transitions: list[dict[str, Any]] | None = None,
    timeout_ms: int = 120_000,
) -> dict[str, Any]:
    """A definition whose nodes' actions are the python handlers of the same name."""
    handlers = sorted({n["action_id"] for n in nodes})
    return {
        "id": fid,
        "timeout_ms": timeout_ms,
        "initial_node": nodes[0]["id"],
        "actions": [
            {"id": h, "kind": "python", "implementation": {"handler": h}} for h in handlers
        ],
        "nodes": nodes,
        "transitions": transitions or [],
    }


def _node(node_id: str, handler: str, **more: Any) -> dict[str, Any]:
    return {"id": node_id, "action_id": handler, **more}


FLOWS = [
    _flow("slow", [_node("a", "slow", timeout_ms=30_000)]),
    _flow("slow_unbounded", [_node("a", "slow")]),
    _flow(
        "any",
        [_node("start", "step_a"), _node("probe", "nap"), _node("report", "step_a")],
        [
            {"id": "spread", "from": "start", "to": "probe", "foreach": "input.delays"},
            {
                "id": "join",
                "from": "probe",
                "to": "report",
                "synchronization": {
                    "strategy": "any",
                    "sibling_group": "spread",
                    "timeout_ms": 60_000,
                },
            },
        ],
    ),
    _flow(
        "ab", [_node("a", "step_a"), _node("b", "step_b")], [{"id": "t", "from": "a", "to": "b"}]
    ),
    _flow("c_only", [_node("c", "step_c")], timeout_ms=10_000),
    _flow(
        "flaky",
        [_node("a", "flaky", timeout_ms=60_000, retry={"max_attempts": 2})],
    ),
]


class Proc:
    """A subprocess whose output is drained all along (a full pipe would block it)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, prefix: str, timeout: float = 60) -> str:
        give_up = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if prefix in line:
                    return line
            assert self.proc.poll() is None, "\n".join(self.lines[-30:])
            assert time.monotonic() < give_up, f"no {prefix!r} line: {self.lines[-30:]}"
            time.sleep(0.02)

    def end(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code


class Cluster:
    """Hosts and workers of one test on one store; every process is ended at the end."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.log = tmp / "stops.log"
        self.procs: list[Proc] = []
        flows = tmp / "flows"
        flows.mkdir()
        for flow in FLOWS:
            (flows / f"{flow['id']}.json").write_text(json.dumps(flow))
        self.flows = flows
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
        self.env = {**inherited, "PYTHONPATH": str(ROOT), "TB_TEST_STOP_LOG": str(self.log)}

    def host(self) -> httpx.Client:
        proc = Proc(
            [sys.executable, "-m", "timebound", "serve", "--port", "0", "--no-worker",
             "--db", self.url, "--actions", ACTIONS, "--workflows", str(self.flows)],
            self.env,
        )  # fmt: skip
        self.procs.append(proc)
        line = proc.wait_line("listening on ")
        client = httpx.Client(base_url=line.split("listening on ")[1].split()[0], timeout=30)
        for _ in range(400):
            try:
                if client.get("/readyz").status_code == 200:
                    return client
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("the host never became ready")

    def worker(self, *args: str, actions: str = ACTIONS) -> Proc:
        proc = Proc(
            [sys.executable, "-m", "timebound", "worker", "--db", self.url,
             "--actions", actions, *args],
            self.env,
        )  # fmt: skip
        self.procs.append(proc)
        proc.wait_line("worker ")  # the readiness line: registered, listening
        return proc

    def lines(self, what: str) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [ln.split() for ln in self.log.read_text().splitlines() if ln.startswith(what)]

    def wait_for(self, check: Callable[[], Any], timeout: float = 60) -> Any:
        give_up = time.monotonic() + timeout
        while not (found := check()):
            assert time.monotonic() < give_up, "the condition never held"
            time.sleep(0.02)
        return found

    def close(self) -> list[int]:
        return [p.end() for p in reversed(self.procs)]


@pytest.fixture
def cluster(pg_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(pg_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def _start(client: httpx.Client, flow: str, input: Any = None) -> str:
    r = client.post(f"/v1/workflows/{flow}/runs", json={"input": input})
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    return run_id


def _ended(client: httpx.Client, run_id: str, timeout: float = 60) -> dict[str, Any]:
    give_up = time.monotonic() + timeout
    while True:
        detail: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
        if detail["run"]["status"] != "running":
            return detail
        assert time.monotonic() < give_up, f"run {run_id} did not end"
        time.sleep(0.05)


def _events(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.get(f"/v1/runs/{run_id}/events").json()["events"]
    return events


@pytest.mark.parametrize("flow", ["slow", "slow_unbounded"])
def test_a_cancel_on_the_host_stops_the_handler_on_a_worker(cluster: Cluster, flow: str) -> None:
    """A run cancelled through a --no-worker host stops its handler in a worker process at once,
    not at the node's 30 s deadline (or, without one, at the handler's end)."""
    host = cluster.host()
    cluster.worker()
    run_id = _start(host, flow)
    cluster.wait_for(lambda: cluster.lines("start"))
    cancelled_at = time.time() * 1000
    assert host.post(f"/v1/runs/{run_id}/cancel").status_code in (200, 202)
    stopped = cluster.wait_for(lambda: cluster.lines("cancelled"), timeout=20)
    lag_ms = float(stopped[0][4]) - cancelled_at
    assert lag_ms < 5_000, lag_ms  # the node's deadline is 30 s away, the handler's end too
    assert _ended(host, run_id)["run"]["status"] == "cancelled"
    # The worker recorded how long stopping the work took, once it had flipped (the metric).
    stops = cluster.wait_for(
        lambda: [e for e in _events(host, run_id) if e["kind"] == "attempt_stopped"]
    )
    assert stops[0]["via"] in ("notify", "sweep") and stops[0]["stop_lag_ms"] >= 0
    metrics = host.get("/metrics").text
    assert f'timebound_workflow_stop_seconds_count{{via="{stops[0]["via"]}"}} 1.0' in metrics


def test_a_bulk_cancel_stops_the_handlers_on_a_worker(cluster: Cluster) -> None:
    """A run whose end cancels its idle tokens in one statement (D6.24a) still stops, at once,
    the handlers a worker in another process runs, and every live token ends cancelled."""
    host = cluster.host()
    cluster.worker("--concurrency", "2")
    run_id = _start(host, "any", {"delays": [30] * 150})
    cluster.wait_for(lambda: len(cluster.lines("start")) == 2)  # two probes run
    assert host.post(f"/v1/runs/{run_id}/cancel").status_code in (200, 202)
    stopped = cluster.wait_for(lambda: len(cluster.lines("cancelled")) == 2, timeout=20)
    assert stopped
    detail = _ended(host, run_id)
    assert detail["run"]["status"] == "cancelled"
    assert {t["status"] for t in detail["tokens"] if t["node_id"] == "probe"} == {"cancelled"}
    bulk = [e for e in _events(host, run_id) if e["kind"] == "tokens_cancelled"]
    assert [e["count"] for e in bulk] == [148]


def test_a_join_decided_on_one_worker_stops_siblings_on_another(cluster: Cluster) -> None:
    """An ``any`` join decided by one worker cancels the slow siblings another worker runs."""
    host = cluster.host()
    cluster.worker("--concurrency", "1")
    cluster.worker("--concurrency", "1")
    cluster.worker("--concurrency", "1")
    run_id = _start(host, "any", {"delays": [60, 60, 0.5]})
    detail = _ended(host, run_id, timeout=30)
    assert detail["run"]["status"] == "completed"
    decided = next(e for e in _events(host, run_id) if e["kind"] == "join_decided")
    cancelled = cluster.wait_for(lambda: len(cluster.lines("cancelled")) >= 2 and
                                 cluster.lines("cancelled"), timeout=20)  # fmt: skip
    pids = {line[5] for line in cluster.lines("start")}
    assert len(pids) >= 2, "the siblings all ran in one process: the test proved nothing"
    for line in cancelled:
        assert float(line[4]) - decided["at_epoch_ms"] < 5_000  # not at the 60 s sleeps' end


def test_workers_claim_only_what_they_can_run(cluster: Cluster, tmp_path: Path) -> None:
    """Two workers with different handlers run 20 two-step runs; none fails for a handler."""
    host = cluster.host()
    for name in ("step_a", "step_b"):
        (tmp_path / f"only_{name}.py").write_text(
            f"from tests.workflow._workers_actions import {name}\n"
        )
        cluster.worker("--actions", str(tmp_path / f"only_{name}.py"))
    runs = [_start(host, "ab") for _ in range(20)]
    statuses = [_ended(host, run_id)["run"] for run_id in runs]
    assert [r["status"] for r in statuses] == ["completed"] * 20, statuses


def test_a_token_no_worker_can_run_stays_pending_visibly(cluster: Cluster, tmp_path: Path) -> None:
    """A node whose handler no live worker has is never claimed: reported by an event, a
    metric and a line of the run's page, then timed out at the run's deadline."""
    host = cluster.host()
    (tmp_path / "only_a.py").write_text("from tests.workflow._workers_actions import step_a\n")
    cluster.worker("--actions", str(tmp_path / "only_a.py"))
    run_id = _start(host, "c_only")
    reported = cluster.wait_for(
        lambda: [e for e in _events(host, run_id) if e["kind"] == "token_unrunnable"], timeout=9
    )
    assert reported[0]["handler"] == "step_c" and reported[0]["node_id"] == "c"
    page = host.get(f"/ui/runs/{run_id}").text
    metrics = host.get("/metrics").text
    if host.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "running":
        assert "needs handler step_c, which no live worker has" in page, page
        assert "timebound_workflow_tokens_unrunnable 1.0" in metrics
    detail = _ended(host, run_id)
    assert detail["run"]["status"] == "timed_out"
    kinds = [e["kind"] for e in _events(host, run_id)]
    assert "token_dispatched" not in kinds, kinds


@pytest.mark.parametrize("flow", ["slow", "slow_unbounded"])
def test_a_killed_workers_step_is_rerun_by_a_survivor_in_seconds(
    cluster: Cluster, flow: str
) -> None:
    """kill -9 of the worker running a step: a survivor runs it again in seconds, long before
    the worker's 30 s lease ends (with and without a node deadline)."""
    host = cluster.host()
    victim = cluster.worker("--lease", "30s")
    run_id = _start(host, flow, {"sleep_s": 60})
    first = cluster.wait_for(lambda: cluster.lines("start"))
    assert first[0][5] == str(victim.proc.pid)
    cluster.worker("--lease", "30s")
    victim.end(signal.SIGKILL)
    killed_at = time.time() * 1000
    again = cluster.wait_for(lambda: len(cluster.lines("start")) >= 2 and cluster.lines("start"),
                             timeout=25)  # fmt: skip
    assert float(again[1][4]) - killed_at < 15_000  # seconds, not the 30 s lease
    events = _events(host, run_id)
    redispatched = [e for e in events if e["kind"] == "token_redispatched"]
    assert [e["reason"] for e in redispatched] == ["worker_died"], redispatched
    assert host.post(f"/v1/runs/{run_id}/cancel").status_code in (200, 202)


def test_a_crash_rerun_spends_no_retry(cluster: Cluster) -> None:
    """A step re-run because its worker died is not a failed attempt: with two attempts
    allowed, a failure after the re-run is still retried, and the run completes."""
    host = cluster.host()
    victim = cluster.worker()
    run_id = _start(host, "flaky")
    cluster.wait_for(lambda: cluster.lines("start"))
    cluster.worker()
    victim.end(signal.SIGKILL)
    detail = _ended(host, run_id, timeout=60)
    assert detail["run"]["status"] == "completed", detail["run"]
    kinds = [e["kind"] for e in _events(host, run_id)]
    assert kinds.count("token_redispatched") == 1 and kinds.count("token_retry_scheduled") == 1


def test_a_run_started_on_one_host_is_watched_and_cancelled_on_another(cluster: Cluster) -> None:
    """Two hosts on one store: a run started on A streams its events on B and is cancelled
    on B; both hosts answer the same state."""
    a, b = cluster.host(), cluster.host()
    cluster.worker()
    run_id = _start(a, "slow")
    seen: list[str] = []

    def watch() -> None:
        with b.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"},
                      timeout=60) as r:  # fmt: skip
            for line in r.iter_lines():
                if line.startswith("event:"):
                    seen.append(line.split(":", 1)[1].strip())
                if "run_cancelled" in line:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cluster.wait_for(lambda: cluster.lines("start"))
    assert b.post(f"/v1/runs/{run_id}/cancel").status_code in (200, 202)
    cluster.wait_for(lambda: cluster.lines("cancelled"), timeout=20)
    watcher.join(timeout=30)
    assert not watcher.is_alive(), seen
    assert "token_executing" in seen or any("executing" in s for s in seen), seen
    assert _ended(a, run_id)["run"]["status"] == "cancelled"
    assert _ended(b, run_id)["run"]["status"] == "cancelled"
    for client in (a, b):  # the operator UI of either host shows the same run, cancelled
        page = client.get(f"/ui/runs/{run_id}").text
        assert 'id="run-status">cancelled<' in page, page


def test_a_worker_started_while_its_store_is_unreachable_waits_for_it(cluster: Cluster) -> None:
    """A worker whose PostgreSQL does not answer yet (a server restarting) says so, keeps trying
    and becomes ready once the server listens, then runs work (it exited 1 with a traceback)."""
    from ..host.test_readiness import Relay

    parts = urlsplit(cluster.url)
    with socket.socket() as probe:  # a port nothing listens on, until the relay does
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    relayed = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
    proc = Proc(
        [sys.executable, "-m", "timebound", "worker", "--db", relayed, "--actions", ACTIONS],
        cluster.env,
    )
    cluster.procs.append(proc)
    proc.wait_line("trying again")
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432), port=port)
    try:
        proc.wait_line("worker ")
        host = cluster.host()
        run_id = _start(host, "ab")
        assert _ended(host, run_id)["run"]["status"] == "completed"
        assert proc.end() == 0
    finally:
        relay.close()
