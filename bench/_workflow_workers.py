"""The multi-process rows of ``bench/workflow.py``: real ``timebound worker`` processes on one
PostgreSQL store, runs started and cancelled by an engine without a worker (as a
``timebound serve --no-worker`` host does), handlers logging to a file when they start and when
they are cancelled (``_workers_actions.py``).

- ``cancel.*``: a run's only step is running on a worker; the host cancels the run.
  ``cancel.flip`` is the host's cancel call (the stop committed), ``cancel.stop`` the time from
  the call to the handler's cancellation on the worker, ``cancel.flip_to_stop`` the difference.
- ``join_stop.*``: an ``any`` join of two branches on two workers (one step each at a time): the
  quick branch's worker decides the join; the time from the decision (its event) to the slow
  sibling's cancellation on the other worker.
- ``dead_worker_rerun.*``: ``kill -9`` of the worker running a step; the time to the step's
  handler starting again on the survivor, for a node with a deadline (60 s) and without.
- ``steps_per_s.postgres_{1,2,4}_workers``: the ten-step workflow, many runs at once; with the
  CPU each step cost the workers, this host and PostgreSQL (``steps_cpu_ms.*``, from ``/proc``)
  and the ceiling that puts on steps/s with this machine's cores (``*.cpu_ceiling``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _workers_actions as handlers
from _common import Row, killed_unless_started, percentile

from timebound import workflow as wf

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _flow(fid: str, nodes: list[dict[str, Any]], transitions: list[Any] | None = None) -> Any:
    names = sorted({n["action_id"] for n in nodes})
    return {
        "id": fid,
        "initial_node": nodes[0]["id"],
        "actions": [{"id": h, "kind": "python", "implementation": {"handler": h}} for h in names],
        "nodes": nodes,
        "transitions": transitions or [],
    }


FLOWS = [
    _flow("slow", [{"id": "a", "action_id": "slow", "timeout_ms": 60_000}]),
    _flow("slow_unbounded", [{"id": "a", "action_id": "slow"}]),
    _flow(
        "any",
        [
            {"id": "start", "action_id": "step"},
            {"id": "probe", "action_id": "nap"},
            {"id": "report", "action_id": "step"},
        ],
        [
            {"id": "spread", "from": "start", "to": "probe", "foreach": "input.delays"},
            {
                "id": "join",
                "from": "probe",
                "to": "report",
                "synchronization": {"strategy": "any", "sibling_group": "spread"},
            },
        ],
    ),
    _flow(
        "ten",
        [{"id": f"s{i}", "action_id": "step"} for i in range(10)],
        [{"id": f"t{i}", "from": f"s{i}", "to": f"s{i + 1}"} for i in range(9)],
    ),
]


class _Worker:
    def __init__(self, url: str, log: Path, *args: str) -> None:
        env = {**os.environ, "TB_BENCH_LOG": str(log), "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "timebound", "worker", "--db", url,
             "--actions", str(HERE / "_workers_actions.py"), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        with killed_unless_started(self.proc):
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()  # the readiness line
            assert line.startswith("worker "), line

    def end(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class _Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self, what: str, run_id: str) -> list[list[str]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if parts[0] == what and parts[1] == run_id:
                out.append(parts)
        return out

    async def wait(self, what: str, run_id: str, count: int = 1, timeout: float = 60) -> Any:
        give_up = time.monotonic() + timeout
        while len(found := self.lines(what, run_id)) < count:
            if time.monotonic() > give_up:
                raise TimeoutError(f"no {what!r} line for run {run_id}")
            await asyncio.sleep(0.002)
        return found


def _host(url: str) -> wf.Engine:
    engine = wf.Engine(
        db=url,
        actions={"step": handlers.step, "slow": handlers.slow, "nap": handlers.nap},
        worker=False,
        sweep="20ms",  # how often its waits poll the store (it has no listener)
    )
    for flow in FLOWS:
        engine.register(flow)
    return engine


async def _cancels(url: str, log: _Log, n: int) -> tuple[list[float], list[float]]:
    flips, stops = [], []
    async with _host(url) as host:
        for _ in range(n):
            run_id = await host.start("slow_unbounded")
            await log.wait("start", run_id)
            t0 = time.time() * 1000
            await host.cancel(run_id)
            flips.append(time.time() * 1000 - t0)
            stopped = await log.wait("cancelled", run_id, timeout=10)
            stops.append(float(stopped[0][3]) - t0)
    return flips, stops


async def _join_stops(url: str, log: _Log, n: int) -> list[float]:
    lags = []
    async with _host(url) as host:
        for _ in range(n):
            run_id = await host.start("any", {"delays": [0.2, 3600]})
            await host.wait(run_id, timeout=30)
            starts = log.lines("start", run_id)
            if len({s[4] for s in starts}) < 2:
                continue  # one process ran both, or the slow one never began: not this row
            stopped = await log.wait("cancelled", run_id, timeout=10)
            decided = next(e for e in await host.events(run_id) if e["kind"] == "join_decided")
            lags.append(float(stopped[0][3]) - decided["at_epoch_ms"])
    return lags


async def _dead_reruns(url: str, log: Path, flow: str, n: int) -> list[float]:
    lags = []
    reader = _Log(log)
    async with _host(url) as host:
        for _ in range(n):
            victim = _Worker(url, log)
            run_id = await host.start(flow)
            await reader.wait("start", run_id)
            survivor = _Worker(url, log)
            victim.end(signal.SIGKILL)
            killed = time.time() * 1000
            again = await reader.wait("start", run_id, 2, timeout=60)
            lags.append(float(again[1][3]) - killed)
            await host.cancel(run_id)
            survivor.end()
    return lags


async def _steps(url: str, runs: int) -> float:
    async with _host(url) as host:
        await host.wait(await host.start("ten"), timeout=60)  # warm up
        started = time.perf_counter()
        ids = await asyncio.gather(*(host.start("ten") for _ in range(runs)))
        for run_id in ids:
            result = await host.wait(run_id, timeout=300)
            assert result.status == "completed", result
        return runs * 10 / (time.perf_counter() - started)


def rows(new_url: Any, drop: Any, tmp: str, quick: bool) -> list[Row]:
    """Every multi-process row; ``new_url()`` gives a fresh store, ``drop(url)`` removes it."""
    out: list[Row] = []
    log_path = Path(tmp) / "workers.log"
    log = _Log(log_path)
    n = 30 if quick else 200

    def run(coro_fn: Any, *workers: tuple[str, ...]) -> Any:
        url = new_url()
        procs: list[_Worker] = []
        try:
            for args in workers:  # one started, one stopped: none left if the next fails
                procs.append(_Worker(url, log_path, *args))
            return asyncio.run(coro_fn(url))
        finally:
            for p in procs:
                p.end()
            drop(url)

    flips, stops = run(lambda url: _cancels(url, log, n), (), ())
    for name, values in (("cancel.flip", flips), ("cancel.stop", stops)):
        for p in (50, 99):
            target = "<= 100" if name == "cancel.stop" and p == 99 else None
            ok = None if target is None else percentile(values, p) <= 100
            out.append(Row(f"{name}.p{p}", percentile(values, p), "ms", target=target, passed=ok))
    diffs = [s - f for s, f in zip(stops, flips, strict=True)]
    out.append(Row("cancel.flip_to_stop.p50", percentile(diffs, 50), "ms"))
    out.append(Row("cancel.flip_to_stop.p99", percentile(diffs, 99), "ms"))
    joins = run(lambda url: _join_stops(url, log, n // 2), ("--concurrency", "1"),
                ("--concurrency", "1"))  # fmt: skip
    out.append(Row("join_stop.p50", percentile(joins, 50), "ms"))
    out.append(Row("join_stop.p99", percentile(joins, 99), "ms", target="<= 100",
                   passed=percentile(joins, 99) <= 100))  # fmt: skip
    out.append(Row("join_stop.samples", len(joins), "count"))
    for flow, label in (("slow", "node_deadline"), ("slow_unbounded", "no_deadline")):
        lags = run(lambda url, flow=flow: _dead_reruns(url, log_path, flow, 3 if quick else 6))
        out.append(Row(f"dead_worker_rerun.{label}.max", max(lags), "ms",
                       target="<= 5000 (lease 30 s)", passed=max(lags) <= 5000))  # fmt: skip
    base = None
    runs = 100 if quick else 300
    for k in (1, 2, 4):
        url = new_url()
        procs = []
        try:
            for _ in range(k):
                procs.append(_Worker(url, log_path))
            before = _cpu([p.proc.pid for p in procs])
            rate = asyncio.run(_steps(url, runs))
            spent = [b - a for a, b in zip(before, _cpu([p.proc.pid for p in procs]), strict=True)]
        finally:
            for p in procs:
                p.end()
            drop(url)
        base = base or rate
        out.append(Row(f"steps_per_s.postgres_{k}_workers", rate, "steps/s",
                       "1 worker process", base))  # fmt: skip
        # Where a step's CPU goes (D6.31): the workers, this host (starts and waits), and
        # PostgreSQL's processes; the cores divided by their sum bound the steps/s.
        per_step = [1000 * x / (runs * 10) for x in spent]
        for name, ms in zip(("workers", "host", "postgres"), per_step, strict=True):
            out.append(Row(f"steps_cpu_ms.postgres_{k}_workers.{name}", ms, "ms/step"))
        cores = os.cpu_count() or 1
        out.append(Row(f"steps_per_s.postgres_{k}_workers.cpu_ceiling", cores * 1000 / sum(per_step),
                       "steps/s"))  # fmt: skip
    return out


def _cpu(workers: list[int]) -> tuple[float, float, float]:
    """CPU seconds spent so far by the worker processes, this process and every process
    named ``postgres`` on the machine (the server's backends: on a shared server, other
    clients' work too, so the ceiling derived from it is a lower bound)."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(pid: int) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick

    server = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    server += of(int(entry.name))
            except OSError:
                pass
    mine = os.times()
    return sum(of(pid) for pid in workers), mine.user + mine.system, server
