"""The host under load: run starts through the API on SQLite and PostgreSQL, API latency with
500 clients, UI paging.

Run: ``python bench/host.py --out bench/results/host.json`` (a few minutes a repeat; ``--quick``
for a smaller run). Prints a table; writes the results only with ``--out``. A real ``python -m timebound serve`` process serves every
measured request over loopback; the clients are one asyncio process of raw HTTP/1.1 keep-alive
connections (tests/host/loadgen.py, the load test's own generator), so the client costs the
shared cores as little as possible. PostgreSQL rows are left out (and said so) when the server at
``TB_BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``) is not reachable.

Rows, for each store (``.sqlite``, ``.postgres``):
- ``api_starts_per_s``: runs started through ``POST /v1/workflows/{id}/runs`` by 50 concurrent
  clients. Baseline: ``Engine.start`` called in-process, 50 at a time, on the same kind of store:
  the ratio is what HTTP, JSON and the host's checks cost per start.
- ``api_latency.p50/p99``: 500 concurrent clients each starting a run and reading it back
  (``GET /v1/runs/{id}``), in a loop. Baseline: the same clients calling ``/healthz`` (the
  server's own floor at that concurrency). ``api_load_errors`` counts resets, timeouts and any
  answer but 201/200.
- ``ui_runs_page_ms`` (SQLite): ``GET /ui/`` over a store of 10,000 runs (one page of 50
  rendered). Baseline: ``GET /v1/runs``, the same page query answered as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from _common import MS, Row, killed_unless_started, percentile, pick, run_bench

ROOT = Path(__file__).resolve().parents[1]
DEFINITION = {
    "id": "bench",
    "initial_node": "a",
    "actions": [{"id": "noop", "kind": "python", "implementation": {"handler": "noop"}}],
    "nodes": [{"id": "a", "action_id": "noop", "timeout_ms": 10_000}],
}
ACTIONS = "def noop(ctx):\n    return None\n"
CLIENTS = 500
# A request slower than this is an error row (a timeout), never a latency sample.
TIMEOUT_S = 60.0

sys.path.insert(0, str(ROOT))  # the load test's generator, shared rather than copied
from tests.host.loadgen import run_load, start_and_read  # noqa: E402


def _launch(tmp: Path, db: str) -> tuple[subprocess.Popen[str], str]:
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
            db,
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
    with killed_unless_started(proc):
        assert proc.stdout is not None
        url = proc.stdout.readline().split("listening on ")[1].split()[0].rstrip("/")
        # Keep reading: the access log goes to stdout, and a full pipe would stall the server.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        for _ in range(200):
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    print(f"host pid {proc.pid} ready at {url}", flush=True)
                    return proc, url
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("the host did not become ready")


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


def measure(args: argparse.Namespace) -> list[Row]:
    starts, seconds, ui_runs = pick(args, (2_000, 15.0, 10_000), (500, 5.0, 2_000), (50, 0.5, 50))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base_rate = asyncio.run(_engine_starts(f"sqlite:///{tmp}/engine.db", starts, 50))
        asyncio.run(_engine_starts(f"sqlite:///{tmp}/host.db", ui_runs, 500))  # the UI's runs
        rows += _measure(tmp, f"sqlite:///{tmp}/host.db", "sqlite", base_rate, seconds, ui=True)
    pg = os.environ.get("TB_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
    if args.smoke:
        print("--smoke: the PostgreSQL rows are left out")
    elif _pg_reachable(pg):
        with _pg_schema(pg) as engine_db, _pg_schema(pg) as host_db:
            base_rate = asyncio.run(_engine_starts(engine_db, starts, 50))
            with tempfile.TemporaryDirectory() as tmp_name:
                rows += _measure(Path(tmp_name), host_db, "postgres", base_rate, seconds)
    else:
        print(f"PostgreSQL at {pg} is not reachable: its rows are left out")
    return rows


def _measure(
    tmp: Path, db: str, name: str, base_rate: float, seconds: float, *, ui: bool = False
) -> list[Row]:
    """Starts/s through the API, then latency under 500 clients, on a host serving ``db``."""
    rows: list[Row] = []
    proc, url = _launch(tmp, db)
    try:
        if ui:  # first, while the host is idle
            with httpx.Client(base_url=url) as client:

                def page(path: str) -> float:
                    best = min(_timed(client, path) for _ in range(20))
                    return best * MS

                rows.append(
                    Row("ui_runs_page_ms", page("/ui/"), "ms", "GET /v1/runs", page("/v1/runs"))
                )
        load = asyncio.run(run_load(url, 50, seconds, _start_only, timeout=TIMEOUT_S))
        rate = load.statuses.get(201, 0) / load.elapsed
        rows.append(
            Row(f"api_starts_per_s.{name}", rate, "/s", "engine.start in-process", base_rate)
        )
        errors = len(load.errors) + sum(n for s, n in load.statuses.items() if s != 201)
        rows.append(Row(f"api_starts_errors.{name}", errors, "", target="== 0", passed=errors == 0))
        _drain(url)
        script = functools.partial(start_and_read, definition="bench")
        load = asyncio.run(run_load(url, CLIENTS, seconds, script, timeout=TIMEOUT_S))
        _drain(url)
        floor = asyncio.run(run_load(url, CLIENTS, seconds, _healthz, timeout=TIMEOUT_S))
        for p in (50, 99):
            rows.append(
                Row(
                    f"api_latency.p{p}.{name}",
                    percentile(load.latencies, p) * MS,
                    "ms",
                    f"/healthz at the same concurrency ({CLIENTS} clients)",
                    percentile(floor.latencies, p) * MS,
                )
            )
        rows.append(
            Row(
                f"api_load_requests_per_s.{name}",
                load.requests / load.elapsed,
                "/s",
                "/healthz at the same concurrency",
                floor.requests / floor.elapsed,
            )
        )
        errors = len(load.errors) + sum(n for s, n in load.statuses.items() if s not in (200, 201))
        rows.append(Row(f"api_load_errors.{name}", errors, "", target="== 0", passed=errors == 0))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return rows


def _drain(url: str) -> None:
    """Wait until every run started so far has ended, so one phase's backlog does not load the
    next."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(1200):
            if not client.get("/v1/runs", params={"status": "running"}).json()["runs"]:
                return
            time.sleep(0.1)
    raise RuntimeError("the host did not finish its runs within 120 s")


async def _start_only(call: Any) -> None:
    status, body = await call("POST", "/v1/workflows/bench/runs", {"input": None})
    if status != 201:
        raise ValueError(f"start answered {status}: {body}")


async def _healthz(call: Any) -> None:
    status, body = await call("GET", "/healthz")
    if status != 200:
        raise ValueError(f"/healthz answered {status}: {body}")


def _pg_reachable(dsn: str) -> bool:
    parts = urlsplit(dsn)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 1.0):
            return True
    except OSError:
        return False


@contextmanager
def _pg_schema(dsn: str) -> Iterator[str]:
    """A store URL in a fresh schema, dropped afterwards (a run stopped by SIGTERM or Ctrl-C
    too: ``_common.signals_unwind``)."""
    import asyncpg

    schema = f"tbbench_{uuid.uuid4().hex[:12]}"
    print(f"PostgreSQL schema {schema}", flush=True)
    try:
        yield f"{dsn}?schema={schema}"
    finally:

        async def drop() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

        asyncio.run(drop())


def _timed(client: httpx.Client, path: str) -> float:
    t = time.perf_counter()
    r = client.get(path)
    r.raise_for_status()
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(run_bench("host", __doc__, measure))
