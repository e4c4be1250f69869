"""The resilience benchmark: hedging, retry budgets and breakers against a real loopback server.

A dependency served by uvicorn in its own process on 127.0.0.1 (this file run with ``--serve``),
called by many concurrent asyncio clients in this process through httpx:

1. **Heavy tail** (``/tail``): 98 % of answers take 10 ms, 2 % take 1 s. Every call runs under a
   300 ms deadline (``timebound.fail_after``). Modes, one after the other in the same run:
   ``fast`` (``/fast``: the same server without the tail: the floor the targets refer to),
   ``none`` (no policy), ``tenacity`` (the usual fix: ``asyncio.wait_for`` of 50 ms per attempt and
   up to 3 attempts on timeout, as ``tenacity`` with ``retry_if_exception_type`` does) and
   ``hedge`` (``resilient(hedge=Hedge("p98", max_extra_load=0.05))``). Per mode: p50/p99/p99.9
   latency (a call cut by the deadline counts as its 300 ms), success rate, and the extra load:
   requests the server received per call, minus one. Targets: the hedged p99 within 2x the fast
   mode's p99, extra load <= 5 %.
2. **Hard failure** (``/fail``: every answer 500): calls with ``retry=3`` and no budget, with a
   ``RetryBudget(0.15, min_per_second=1)``, and with a ``CircuitBreaker(min_calls=20,
   break_for="1s")``. Row: requests that reached the dependency per call offered; target
   <= 1.2 for the budget and the breaker.
3. **Happy-path overhead** of ``resilient(hedge=...)`` and ``resilient(breaker=...)`` against
   ``resilient()``: over loopback HTTP (``/noop``; the target, <= 1.2x) and, for reference, around
   an in-process coroutine that returns at once (the policy's own cost, no target). And the
   cost of a hedged sync call that needs no hedge (``overhead.sync.hedge_us``: the race starts
   its primary in a thread and the caller waits for it, D3.14) around a ``def`` that returns at
   once, against the same ``def`` under ``resilient()``: for reference, no target.

The machine may be shared: the load average is recorded at the start and the end, and every
comparison is a ratio within the same run. ``--quick`` is a short run (about a minute a repeat).
The client's connection pool is unbounded: httpcore 1.0.9 loses a pool slot for good when a
request is cancelled while waiting for a connection, which empties a bounded pool under any
mode that cancels requests.
``python bench/resilience.py --out bench/results/resilience.json`` writes the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import US, Row, interleave, killed_unless_started, percentile, pick, run_bench

import timebound as tb
from timebound.policies import CircuitBreaker, Hedge, RetryBudget

DEADLINE = 0.300
FAST = 0.010
SLOW = 1.0
SLOW_SHARE = 0.02
ROUNDS = [5]  # interleaved rounds of the heavy-tail modes (set per tier)
ERRORS: dict[str, int] = {}
VERBOSE = os.environ.get("RESILIENCE_VERBOSE") == "1"
HEDGE_AT = os.environ.get("RESILIENCE_HEDGE_AT", "p98")


# The dependency (run with --serve) ---------------------------------------------------------------


def serve(port: int, seed: int) -> None:
    """uvicorn on 127.0.0.1:port; counts the requests each path received."""
    import uvicorn

    rng = random.Random(seed)
    counts: dict[str, int] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        status, body = 200, b"ok"
        if path == "/stats":
            body = json.dumps(counts).encode()
        elif path == "/reset":
            counts.clear()
        else:
            counts[path] = counts.get(path, 0) + 1
            if path == "/tail":
                await asyncio.sleep(SLOW if rng.random() < SLOW_SHARE else FAST)
            elif path == "/fast":
                await asyncio.sleep(FAST)
            elif path == "/fail":
                status, body = 500, b"down"
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="error", lifespan="off", access_log=False
    )


class Server:
    def __init__(self, seed: int) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--seed", str(seed)]
        )

    def __enter__(self) -> Server:
        with killed_unless_started(self.proc):
            for _ in range(200):
                try:
                    httpx.get(f"{self.url}/stats", timeout=1)
                    return self
                except httpx.HTTPError:
                    time.sleep(0.05)
            raise RuntimeError("the dependency did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def received(self, path: str) -> int:
        counts: dict[str, int] = httpx.get(f"{self.url}/stats", timeout=5).json()
        return counts.get(path, 0)

    def reset(self) -> None:
        httpx.get(f"{self.url}/reset", timeout=5)


# Load ---------------------------------------------------------------------------------------------


async def drive(
    call: Callable[[], Awaitable[Any]], calls: int, clients: int
) -> tuple[list[float], int]:
    """``calls`` calls from ``clients`` concurrent workers, each under the 300 ms deadline:
    (latencies in seconds, successes)."""
    latencies: list[float] = []
    ok = 0
    left = calls

    async def worker() -> None:
        nonlocal left, ok
        while left > 0:
            left -= 1
            start = time.perf_counter()
            try:
                with tb.fail_after(DEADLINE):
                    await call()
                ok += 1
            except Exception as exc:
                ERRORS[type(exc).__name__] = ERRORS.get(type(exc).__name__, 0) + 1
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(clients)))
    return latencies, ok


async def heavy_tail(server: Server, calls: int, clients: int) -> list[Row]:
    # No pool limit, and a fresh client for every mode and round: httpcore 1.0.9 leaks a pool
    # slot for good when a request is cancelled while it waits for a connection
    # (httpcore issue 1093), and the modes that cancel requests (wait_for, a losing hedge)
    # would leave the zombies to tax the modes after them.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=4 * clients)
    current: dict[str, httpx.AsyncClient] = {}

    async def get(path: str) -> None:
        (await current["client"].get(path)).raise_for_status()

    async def fast() -> None:
        await get("/fast")

    async def none() -> None:
        await get("/tail")

    async def tenacity_style() -> None:
        for attempt in range(3):
            try:
                await asyncio.wait_for(get("/tail"), 0.050)
                return
            except TimeoutError:
                if attempt == 2:
                    raise

    @tb.resilient(hedge=Hedge(HEDGE_AT, max_extra_load=0.05))
    async def hedged() -> None:
        await get("/tail")

    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=5) as client:
        current["client"] = client
        # The hedge learns its delay on a warm-up outside the measurement.
        await drive(hedged, 200, clients)
    modes: dict[str, tuple[str, Callable[[], Awaitable[Any]]]] = {
        "fast": ("/fast", fast),
        "none": ("/tail", none),
        "tenacity": ("/tail", tenacity_style),
        "hedge": ("/tail", hedged),
    }
    # Interleaved rounds: a busy spell of the shared machine hits every mode alike.
    pooled: dict[str, tuple[list[float], int, int]] = {m: ([], 0, 0) for m in modes}
    per_round = max(1, calls // ROUNDS[0])
    for _ in range(ROUNDS[0]):
        for mode, (path, call) in modes.items():
            server.reset()
            async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=5) as client:
                current["client"] = client
                lat, ok = await drive(call, per_round, clients)
            seen, oks, received = pooled[mode]
            if VERBOSE:
                print(f"    {mode}: {ok}/{len(lat)} ok, errors so far {ERRORS}", flush=True)
            pooled[mode] = (seen + lat, oks + ok, received + server.received(path))
    results: dict[str, dict[str, float]] = {}
    for mode, (lat, ok, received) in pooled.items():
        results[mode] = {
            "p50": percentile(lat, 50),
            "p99": percentile(lat, 99),
            "p999": percentile(lat, 99.9),
            "success": ok / len(lat),
            "extra": received / len(lat) - 1,
        }
        print(f"  {mode}: {results[mode]}", flush=True)
    if VERBOSE:
        print(f"  errors: {ERRORS}", flush=True)
    hedge = hedged.policy.hedge
    assert hedge is not None
    fast_p99 = results["fast"]["p99"]
    rows = []
    for mode in ("fast", "none", "tenacity", "hedge"):
        r = results[mode]
        is_hedge = mode == "hedge"
        rows += [
            Row(f"tail.{mode}.p50_ms", r["p50"] * 1e3, "ms"),
            Row(
                f"tail.{mode}.p99_ms",
                r["p99"] * 1e3,
                "ms",
                "fast mode p99" if mode != "fast" else None,
                fast_p99 * 1e3 if mode != "fast" else None,
                "<= 2x" if is_hedge else None,
                (r["p99"] <= 2 * fast_p99) if is_hedge else None,
            ),
            Row(f"tail.{mode}.p999_ms", r["p999"] * 1e3, "ms"),
            Row(f"tail.{mode}.success", r["success"], "share"),
            Row(
                f"tail.{mode}.extra_load",
                r["extra"],
                "share",
                target="<= 0.05" if is_hedge else None,
                passed=(r["extra"] <= 0.05) if is_hedge else None,
            ),
        ]
    rows.append(Row("tail.hedge.sent", hedge.sent, "hedges"))
    rows.append(Row("tail.hedge.won", hedge.won, "hedges"))
    for reason, n in hedge.suppressed.items():
        rows.append(Row(f"tail.hedge.suppressed.{reason}", n, "hedges"))
    return rows


async def hard_failure(server: Server, calls: int, clients: int) -> list[Row]:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:

        async def get() -> None:
            (await client.get("/fail")).raise_for_status()

        variants = {
            "no_budget": tb.resilient(retry=3, delay="1ms")(get),
            "budget": tb.resilient(
                retry=3, delay="1ms", retry_budget=RetryBudget(0.15, min_per_second=1)
            )(get),
            "breaker": tb.resilient(
                retry=3, delay="1ms", breaker=CircuitBreaker(min_calls=20, break_for="1s")
            )(get),
        }
        rows = []
        for name, call in variants.items():
            server.reset()
            await drive(call, calls, clients)
            load = server.received("/fail") / calls
            print(f"  hard failure {name}: {load:.3f} requests per call", flush=True)
            checked = name != "no_budget"
            rows.append(
                Row(
                    f"failing.{name}.load",
                    load,
                    "requests/call",
                    "offered calls",
                    1.0,
                    "<= 1.2x" if checked else None,
                    (load <= 1.2) if checked else None,
                )
            )
    return rows


def overhead(server: Server, tier: str) -> list[Row]:
    rows: list[Row] = []
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(base_url=server.url, timeout=5)

    async def http_noop() -> None:
        (await client.get("/noop")).raise_for_status()

    async def noop() -> None:
        return None

    for where, target, fn, n in (
        ("http", http_noop, True, {"full": 1000, "quick": 200, "smoke": 20}[tier]),
        ("inproc", noop, False, {"full": 20000, "quick": 2000, "smoke": 200}[tier]),
    ):
        del fn
        plain = tb.resilient()(target)
        hedged = tb.resilient(hedge=Hedge("p99"))(target)
        broken = tb.resilient(breaker=CircuitBreaker())(target)

        def timer(f: Callable[[], Awaitable[None]], n: int = n) -> Callable[[], float]:
            async def many() -> float:
                start = time.perf_counter()
                for _ in range(n):
                    await f()
                return time.perf_counter() - start

            return lambda: loop.run_until_complete(many())

        times = interleave(
            {"plain": timer(plain), "hedge": timer(hedged), "breaker": timer(broken)},
            rounds={"full": 7, "quick": 3, "smoke": 1}[tier],
            n=n,
        )
        for name in ("hedge", "breaker"):
            checked = where == "http"
            ratio = times[name] / times["plain"]
            rows.append(
                Row(
                    f"overhead.{where}.{name}_us",
                    times[name] * US,
                    "us/call",
                    f"resilient() ({where})",
                    times["plain"] * US,
                    "<= 1.2x" if checked else None,
                    (ratio <= 1.2) if checked else None,
                )
            )
    loop.run_until_complete(client.aclose())
    loop.close()

    def sync_noop() -> None:
        return None

    n = {"full": 5000, "quick": 1000, "smoke": 100}[tier]
    # A fixed delay, so that every call races (a learned one races nothing until it is known).
    sync_calls = {
        "plain": tb.resilient()(sync_noop),
        "hedge": tb.resilient(hedge=Hedge("1s", max_extra_load=1))(sync_noop),
    }

    def sync_timer(f: Callable[[], None]) -> Callable[[], float]:
        def many() -> float:
            start = time.perf_counter()
            for _ in range(n):
                f()
            return time.perf_counter() - start

        return many

    times = interleave(
        {name: sync_timer(f) for name, f in sync_calls.items()},
        rounds={"full": 7, "quick": 3, "smoke": 1}[tier],
        n=n,
    )
    rows.append(
        Row(
            "overhead.sync.hedge_us",
            times["hedge"] * US,
            "us/call",
            "resilient() (sync)",
            times["plain"] * US,
        )
    )
    return rows


def measure(args: argparse.Namespace) -> list[Row]:
    calls = pick(args, 10000, 2000, 100)
    ROUNDS[0] = pick(args, 5, 5, 1)
    tier = pick(args, "full", "quick", "smoke")
    clients = int(os.environ.get("RESILIENCE_CLIENTS", "8"))
    rows: list[Row] = []
    with Server(seed=args.seed) as server:
        print("heavy tail", flush=True)
        rows += asyncio.run(heavy_tail(server, calls, clients))
        print("hard failure", flush=True)
        rows += asyncio.run(hard_failure(server, calls // 2, clients))
        print("overhead", flush=True)
        rows += overhead(server, tier)
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help="the dependency's random seed")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
        serve(int(sys.argv[2]), seed)
    else:
        sys.exit(run_bench("resilience", __doc__, measure, configure=_options))
