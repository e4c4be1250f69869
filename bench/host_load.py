"""Timer lateness under hostile load: canary runs' node timeouts while a real host is busy.

Run: ``python bench/host_load.py --out bench/results/host_load.json`` (a few minutes a repeat;
``--quick`` for a smaller run). Prints a table; writes the results only with ``--out``. A real ``python -m timebound serve`` process
serves everything over loopback, on SQLite, then on PostgreSQL (``TB_BENCH_PG``, default
``postgresql://postgres@127.0.0.1:5432/test``; its rows are left out, and said so, when it is not
reachable); the clients run in this process.

A canary is a run whose node sleeps 5 s under a 300 ms node timeout, after a first node that
waits its turn: a phase's canaries are all started before its load, and arm their timers one
every 100 ms while the load runs (so a host too busy to answer a start is still measured). Its
lateness is the ``detection_lag_ms`` its ``token_timed_out`` event records: from the node's
deadline to the instant the engine stored the timeout, i.e. how late the host fired the timer. Phases, each against the same host:

- ``idle``: canaries only (the baseline of every other row);
- ``scrapers``: 4 clients scraping ``/metrics`` back to back over a store holding a large
  history of timeout events (100 k with ``--quick``, 400 k otherwise);
- ``large_puts``: 2 clients PUTting 10,000-node definitions back to back;
- ``fanout_bomb``: one start whose ``foreach`` in ``foreach`` makes N x N tokens (100 x 100 with
  ``--quick``, 300 x 300 otherwise), run last since its work outlives the phase.

Target: p99 lateness <= 100 ms under each load. The machine is shared: the 1-minute load average
is recorded at the start and the end. ``--stores postgres`` (or ``sqlite``) runs one store only;
``--smoke`` runs SQLite only unless ``--stores`` says otherwise.

Each host's pid and each PostgreSQL schema are printed as they start; SIGTERM or Ctrl-C stops
the host and drops the schema as a normal end does (``_common.signals_unwind``).
"""

from __future__ import annotations

import argparse
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
from _common import Row, killed_unless_started, percentile, pick, run_bench

from host import _pg_reachable, _pg_schema

ROOT = Path(__file__).resolve().parents[1]
# Set per tier by measure(): seconds per phase, events of history, the bomb's N (N x N tokens).
PHASE_S = 10.0
HISTORY = 400_000
BOMB = 300
CANARY_EVERY_S = 0.1
TARGET_MS = 100.0

ACTIONS = """
import asyncio

async def wait(ctx):
    await asyncio.sleep(ctx.input["delay"])

async def canary(ctx):
    await asyncio.sleep(5)

def noop(ctx):
    return None
"""
CANARY = {
    "id": "canary",
    "initial_node": "wait",
    "actions": [
        {"id": "wait", "kind": "python", "implementation": {"handler": "wait"}},
        {"id": "sleep", "kind": "python", "implementation": {"handler": "canary"}},
    ],
    "nodes": [
        {"id": "wait", "action_id": "wait"},
        {"id": "a", "action_id": "sleep", "timeout_ms": 300},
    ],
    "transitions": [{"id": "go", "from": "wait", "to": "a"}],
}
BOMB_DEFINITION = {
    "id": "bomb",
    "initial_node": "start",
    "actions": [{"id": "noop", "kind": "python", "implementation": {"handler": "noop"}}],
    "nodes": [{"id": n, "action_id": "noop"} for n in ("start", "outer", "inner")],
    "transitions": [
        {"id": "spread", "from": "start", "to": "outer", "foreach": "input.items"},
        {"id": "again", "from": "outer", "to": "inner", "foreach": "input.items"},
    ],
}


def _large(k: int, nodes: int = 10_000) -> dict[str, Any]:
    return {
        "id": f"large{k}",
        "initial_node": "n0",
        "actions": [{"id": "noop", "kind": "python", "implementation": {"handler": "noop"}}],
        "nodes": [{"id": f"n{i}", "action_id": "noop"} for i in range(nodes)],
        "transitions": [
            {"id": f"t{i}", "from": f"n{i}", "to": f"n{i + 1}"} for i in range(nodes - 1)
        ],
    }


async def _plant_history(db: str, n: int) -> None:
    """``n`` stored timeout events (what a busy host accumulates), written straight to the
    store before the host starts."""
    from timebound._store import open_store

    store = open_store(db)
    await store.open()
    try:
        data = json.dumps(
            {"timeout_type": "execution", "policy_applied": "fail", "detection_lag_ms": 3}
        )
        for start in range(0, n, 50_000):
            async with store.transaction() as tx:
                await tx.execute_many(
                    "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)",
                    [
                        (f"old-{i}", "token_timed_out", 1_000 + i, data)
                        for i in range(start, min(n, start + 50_000))
                    ],
                )
    finally:
        await store.close()


def _launch(tmp: Path, db: str) -> tuple[subprocess.Popen[str], str]:
    flows = tmp / "flows"
    flows.mkdir(exist_ok=True)
    (flows / "canary.json").write_text(json.dumps(CANARY))
    (flows / "bomb.json").write_text(json.dumps(BOMB_DEFINITION))
    (tmp / "load_actions.py").write_text(ACTIONS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "timebound", "serve", "--port", "0", "--db", db,
         "--actions", "load_actions", "--workflows", "flows"],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    with killed_unless_started(proc):
        assert proc.stdout is not None
        url = proc.stdout.readline().split("listening on ")[1].split()[0].rstrip("/")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # never a full pipe
        for _ in range(400):
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    print(f"host pid {proc.pid} ready at {url}", flush=True)
                    return proc, url
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the host did not become ready")


async def _canaries(client: httpx.AsyncClient) -> list[str]:
    """Start the phase's canaries before its load: each waits its turn (one every 100 ms over
    the phase), then arms its 300 ms node timeout, so the timers fall while the load runs even if
    the loaded host could not answer a start then."""
    count = int(PHASE_S / CANARY_EVERY_S)
    ids: list[str] = []
    for k in range(count):
        delay = 0.3 + k * CANARY_EVERY_S
        response = await client.post("/v1/workflows/canary/runs", json={"input": {"delay": delay}})
        response.raise_for_status()
        ids.append(response.json()["run_id"])
    return ids


async def _lateness(client: httpx.AsyncClient, ids: list[str]) -> tuple[list[float], int]:
    """The canaries' detection lags (ms), once each has timed out; and how many never did."""
    lags: list[float] = []
    missing = 0
    for run_id in ids:
        for _ in range(600):
            events = (await client.get(f"/v1/runs/{run_id}/events")).json()["events"]
            timed_out = [e for e in events if e["kind"] == "token_timed_out"]
            if timed_out:
                lags.append(float(timed_out[0]["detection_lag_ms"]))
                break
            await asyncio.sleep(0.1)
        else:
            missing += 1
    return lags, missing


async def _scraper(client: httpx.AsyncClient, stop: asyncio.Event, times: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        (await client.get("/metrics")).raise_for_status()
        times.append(time.perf_counter() - t)


async def _putter(
    client: httpx.AsyncClient, stop: asyncio.Event, who: int, statuses: dict[int, int]
) -> None:
    body = _large(who)
    raw = json.dumps(body).encode()
    k = 0
    while not stop.is_set():
        k += 1
        definition_id = f"large{who}x{k}"
        payload = raw.replace(f'"large{who}"'.encode(), f'"{definition_id}"'.encode(), 1)
        response = await client.put(
            f"/v1/definitions/{definition_id}",
            content=payload,
            headers={"content-type": "application/json"},
        )
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1


async def _bomb(client: httpx.AsyncClient, stop: asyncio.Event, statuses: dict[int, int]) -> None:
    response = await client.post(
        "/v1/workflows/bomb/runs", json={"input": {"items": list(range(BOMB))}}
    )
    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1


async def _phase(url: str, name: str, load: Any) -> tuple[list[float], int, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        stop = asyncio.Event()
        ids = await _canaries(client)
        extra = await load(client, stop) if load is not None else None
        await asyncio.sleep(PHASE_S + 0.3)
        stop.set()
        detail = None
        if extra is not None:
            tasks, detail = extra
            await asyncio.gather(*tasks, return_exceptions=True)
        lags, missing = await _lateness(client, ids)
    print(f"{name}: {len(lags)} canaries, p99 {percentile(lags, 99):.1f} ms", flush=True)
    return lags, missing, detail


async def _with_scrapers(client: httpx.AsyncClient, stop: asyncio.Event) -> Any:
    times: list[float] = []
    return [asyncio.create_task(_scraper(client, stop, times)) for _ in range(4)], times


async def _with_puts(client: httpx.AsyncClient, stop: asyncio.Event) -> Any:
    statuses: dict[int, int] = {}
    return [asyncio.create_task(_putter(client, stop, i, statuses)) for i in range(2)], statuses


async def _with_bomb(client: httpx.AsyncClient, stop: asyncio.Event) -> Any:
    statuses: dict[int, int] = {}
    return [asyncio.create_task(_bomb(client, stop, statuses))], statuses


def _store_rows(db: str, store: str, phases: tuple[str, ...]) -> list[Row]:
    """Plant the history in ``db``, serve it, run ``phases``; the rows named ``store``."""
    loads = {
        "idle": None,
        "scrapers": _with_scrapers,
        "large_puts": _with_puts,
        "fanout_bomb": _with_bomb,
    }
    results: dict[str, tuple[list[float], int, Any]] = {}
    asyncio.run(_plant_history(db, HISTORY))
    with tempfile.TemporaryDirectory() as tmp_name:
        proc, url = _launch(Path(tmp_name), db)
        try:
            for name in phases:
                results[name] = asyncio.run(_phase(url, f"{store} {name}", loads[name]))
        finally:
            proc.send_signal(signal.SIGKILL)  # the bomb's tokens need not be drained
            proc.wait(timeout=30)
    rows: list[Row] = []
    idle = results["idle"][0]
    for name, (lags, missing, detail) in results.items():
        prefix = f"host_load.{store}.{name}"
        for p in (50, 99):
            value = percentile(lags, p) if lags else float("inf")
            row = Row(f"{prefix}.lateness_p{p}", value, "ms")
            if name != "idle":
                row.baseline, row.baseline_value = "same host idle", percentile(idle, p)
            if p == 99:
                row.target, row.passed = f"<= {TARGET_MS:g} ms", value <= TARGET_MS
            rows.append(row)
        rows.append(
            Row(f"{prefix}.canaries_not_timed_out", missing, "", target="== 0",
                passed=missing == 0)
        )  # fmt: skip
        if name == "scrapers":
            rows.append(Row(f"{prefix}.scrapes", len(detail), ""))
            rows.append(
                Row(f"{prefix}.scrape_p50_with_{HISTORY // 1000}k_events",
                    percentile(detail, 50) * 1000, "ms")
            )  # fmt: skip
        elif detail is not None:
            for status, n in sorted(detail.items()):
                rows.append(Row(f"{prefix}.answers_{status}", n, ""))
    return rows


def measure(args: argparse.Namespace) -> list[Row]:
    global PHASE_S, HISTORY, BOMB
    PHASE_S, HISTORY, BOMB = pick(args, (10.0, 400_000, 300), (4.0, 100_000, 100), (1.0, 1000, 5))
    rows: list[Row] = []
    all_phases = ("idle", "scrapers", "large_puts", "fanout_bomb")
    stores = args.stores or (["sqlite"] if args.smoke else ["sqlite", "postgres"])
    if "sqlite" in stores:
        with tempfile.TemporaryDirectory() as tmp_name:
            rows += _store_rows(f"sqlite:///{tmp_name}/host.db", "sqlite", all_phases)
    pg = os.environ.get("TB_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
    if "postgres" not in stores:
        print("the PostgreSQL rows are left out (--smoke, or --stores)")
    elif _pg_reachable(pg):
        with _pg_schema(pg) as db:
            rows += _store_rows(db, "postgres", all_phases)
    else:
        print(f"PostgreSQL at {pg} is not reachable: its rows are left out")
    return rows


STORES = ("sqlite", "postgres")


def _stores(text: str) -> list[str]:
    stores = [name.strip() for name in text.split(",")]
    if not all(name in STORES for name in stores):
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of {' and '.join(STORES)}, got {text!r}"
        )
    return stores


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stores",
        type=_stores,
        default=None,
        help="comma-separated stores to run: sqlite, postgres (default: both; sqlite with --smoke)",
    )


if __name__ == "__main__":
    sys.exit(run_bench("host_load", __doc__, measure, configure=_options))
