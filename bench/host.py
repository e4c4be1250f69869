"""The host under load: run starts through the API, API latency with 500 clients, UI paging.

Run: ``python bench/host.py`` (about a minute; ``--quick`` for a smaller run). Prints a table and
writes ``bench/results/host.json``. A real ``python -m timebound serve`` process on SQLite serves
every measured request over loopback.

Rows:
- ``api_starts_per_s``: runs started through ``POST /v1/workflows/{id}/runs`` by 50 concurrent
  clients. Baseline: ``Engine.start`` called in-process, 50 at a time, on the same kind of store:
  the ratio is what HTTP, JSON and the host's checks cost per start.
- ``api_latency.p50/p99``: 500 concurrent clients each starting a run and reading it back.
  Baseline: the same clients calling ``/healthz`` (the server's own floor at that concurrency).
- ``ui_runs_page_ms``: ``GET /ui/`` over a store of 10,000 runs (one page of 50 rendered).
  Baseline: ``GET /v1/runs``, the same page query answered as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from _common import MS, Row, percentile, print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
DEFINITION = {
    "id": "bench",
    "initial_node": "a",
    "actions": [{"id": "noop", "kind": "python", "implementation": {"handler": "noop"}}],
    "nodes": [{"id": "a", "action_id": "noop", "timeout_ms": 10_000}],
}
ACTIONS = "def noop(ctx):\n    return None\n"


def _launch(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    (tmp / "flows").mkdir(exist_ok=True)
    (tmp / "flows" / "bench.json").write_text(json.dumps(DEFINITION))
    (tmp / "bench_actions.py").write_text(ACTIONS)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "timebound",
            "serve",
            "--port",
            "0",
            "--db",
            f"sqlite:///{tmp}/host.db",
            "--actions",
            "bench_actions",
            "--workflows",
            "flows",
        ],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().split("listening on ")[1].split()[0].rstrip("/")
    # Keep reading: the access log goes to stdout, and a full pipe would stall the server.
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    for _ in range(200):
        try:
            if httpx.get(url + "/readyz").status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("the host did not become ready")


async def _clients(url: str, n: int, calls: Any) -> tuple[list[float], int]:
    """``n`` concurrent clients each running ``calls(client)``; per-request seconds, errors."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one() -> None:
            nonlocal errors
            for method, path, body in calls():
                t = time.perf_counter()
                try:
                    r = await client.request(method, path, json=body)
                except httpx.TransportError:  # a reset or refused connection is an error row
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t)
                errors += r.status_code >= 400

        await asyncio.gather(*(one() for _ in range(n)))
    return latencies, errors


async def _engine_starts(db: str, n: int, width: int) -> float:
    """Starts per second in-process; every run is then waited for, so the store is left with
    finished runs only (a host opened on it has nothing to resume)."""
    from timebound import workflow as wf

    engine = wf.Engine(db=db, actions={"noop": lambda ctx: None})
    engine.register(DEFINITION)
    async with engine:
        t = time.perf_counter()
        ids: list[str] = []
        for _ in range(n // width):
            ids += await asyncio.gather(*(engine.start("bench") for _ in range(width)))
        rate = n / (time.perf_counter() - t)
        for run_id in ids:
            await engine.wait(run_id)
        return rate


def main() -> None:
    quick = "--quick" in sys.argv
    starts, load_clients = (500, 100) if quick else (2_000, 500)
    ui_runs = 2_000 if quick else 10_000
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base_rate = asyncio.run(_engine_starts(f"sqlite:///{tmp}/engine.db", starts, 50))
        asyncio.run(_engine_starts(f"sqlite:///{tmp}/host.db", ui_runs, 500))  # the UI's runs
        proc, url = _launch(tmp)
        try:
            t = time.perf_counter()
            _, errors = asyncio.run(
                _clients(
                    url,
                    50,
                    lambda: (
                        [("POST", "/v1/workflows/bench/runs", {"input": None})] * (starts // 50)
                    ),
                )
            )
            rate = starts / (time.perf_counter() - t)
            rows.append(Row("api_starts_per_s", rate, "/s", "engine.start in-process", base_rate))
            rows.append(Row("api_starts_errors", errors, "", target="== 0", passed=errors == 0))

            def start_and_read() -> list[tuple[str, str, Any]]:
                return [
                    ("POST", "/v1/workflows/bench/runs", {"input": None}),
                    ("GET", "/v1/runs?definition=bench", None),
                ]

            lat, errors = asyncio.run(_clients(url, load_clients, start_and_read))
            floor, _ = asyncio.run(
                _clients(url, load_clients, lambda: [("GET", "/healthz", None)] * 2)
            )
            for p in (50, 99):
                rows.append(
                    Row(
                        f"api_latency.p{p}",
                        percentile(lat, p) * MS,
                        "ms",
                        "/healthz at the same concurrency",
                        percentile(floor, p) * MS,
                    )
                )
            rows.append(Row("api_load_errors", errors, "", target="== 0", passed=errors == 0))
            with httpx.Client(base_url=url) as client:

                def page(path: str) -> float:
                    best = min(_timed(client, path) for _ in range(20))
                    return best * MS

                rows.append(
                    Row("ui_runs_page_ms", page("/ui/"), "ms", "GET /v1/runs", page("/v1/runs"))
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    print_table(rows, "host")
    write_results("host", rows)


def _timed(client: httpx.Client, path: str) -> float:
    t = time.perf_counter()
    r = client.get(path)
    r.raise_for_status()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
