"""What the breakdown costs (D13.8) and whether a chain's caller gets it (D13.9).

The cost: this tree against the build without the breakdown, in the same run. That build is
``src/`` at the commit just before the breakdown joined the mainline (the first parent of the
first-parent commit that added ``_core/_breakdown.py``; ``git archive`` into a temporary
directory): the ratio also carries whatever else changed since. Each measurement runs in a child
process per build, the builds interleaved, the best of the rounds kept:

- ``scope``: entering and leaving ``fail_after(1)`` around an ``await`` in a task (the
  per-request scope; records nothing, pays the exit's one test);
- ``policy_under_scope``: a policy call with an attempt timeout under a request scope (records
  one attempt per call: the per-call price of the breakdown);
- ``hop``: one request through ``DeadlineMiddleware`` (``expose_breakdown=True`` in this tree)
  whose handler calls a downstream service through ``AsyncDeadlineTransport``, in process
  (httpx's ``MockTransport`` as the downstream: no sockets, so the hop's own code is what is
  measured, not the loopback's noise).

- ``chain``: the propagation benchmark's chain (``bench/_services.py``: load generator -> A -> B
  -> C, each its own uvicorn process, C the CPU-bound bottleneck behind ``AdmissionMiddleware``,
  mode M4) as docs/breakdown.md recommends configuring it: ``expose_breakdown=True`` on every
  service, A and B serving with a reserve of :data:`RESERVE` (D1.18) and letting a spent
  deadline escape their handlers, so that each answers 498, with its side, before its caller
  gives up. Open-loop Poisson load at rho = 2 times the chain's capacity, every request given up
  at 250 ms: the load generator calls A through ``AsyncDeadlineTransport`` inside
  ``fail_after(0.25)``; for every request that ends in ``DeadlineExceeded`` it checks that a
  breakdown came with A's side in it (a ``remote`` part) and how far the breakdown's elapsed
  time (the sum of its parts) is from the elapsed time the caller measured around the call.

``python bench/breakdown.py --out breakdown`` writes ``bench/results/breakdown.json``; ``--quick``
runs fewer rounds and a shorter chain run, ``--no-chain`` only the cost rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Row, pick, run_bench

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, inspect, json, sys, time
import httpx
import timebound
from timebound.policies import Policy
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport

N = int(sys.argv[1])
# Bounds that never fire: on a loaded machine a process may wait a second for a core, and the
# cost of a scope does not depend on its timeout.
LONG = 60
EXPOSE = "expose_breakdown" in inspect.signature(DeadlineMiddleware).parameters


async def scope() -> float:
    t = time.perf_counter()
    for _ in range(N):
        with timebound.fail_after(LONG):
            await asyncio.sleep(0)
    return (time.perf_counter() - t) / N


async def nothing() -> int:
    return 1


async def policy_under_scope() -> float:
    p = Policy("p", timeout=LONG, retry=2)
    t = time.perf_counter()
    for _ in range(N):
        with timebound.fail_after(LONG):
            await p.execute(nothing)
    return (time.perf_counter() - t) / N


async def hop() -> float:
    down = httpx.AsyncClient(
        transport=AsyncDeadlineTransport(httpx.MockTransport(lambda r: httpx.Response(200)))
    )

    async def app(scope, receive, send):
        await down.get("http://downstream/x")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    kw = {"expose_breakdown": True} if EXPOSE else {}
    mw = DeadlineMiddleware(app, **kw)
    scope_ = {
        "type": "http", "method": "GET", "path": "/", "headers": [
            (b"x-yataxi-client-timeoutms", str(LONG * 1000).encode())
        ],
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    n = max(1, N // 20)
    t = time.perf_counter()
    for _ in range(n):
        await mw(scope_, receive, send)
    return (time.perf_counter() - t) / n


async def main() -> None:
    out = {}
    for name, fn in (("scope", scope), ("policy_under_scope", policy_under_scope), ("hop", hop)):
        await fn()  # warm
        out[name] = await fn()
    print(json.dumps(out))


asyncio.run(main())
"""


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def base_commit() -> str:
    """The mainline commit just before the breakdown: the first parent of the first-parent
    commit that added ``_core/_breakdown.py``."""
    added = _git(
        "log",
        "--first-parent",
        "--diff-filter=A",
        "--format=%H",
        "HEAD",
        "--",
        "src/timebound/_core/_breakdown.py",
    ).split()[-1]
    return _git("rev-parse", f"{added}^1")


def base_tree(tmp: Path, base: str) -> Path:
    archive = subprocess.run(
        ["git", "archive", base, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp / "src"


def _measure_build(src: Path, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n)],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


async def _chain_load(url: str, rate: float, seconds: float) -> list[tuple[float, Any]]:
    """Poisson arrivals at ``rate``/s for ``seconds``: (observed ms, error or None) per request
    that timed out (``DeadlineExceeded``); requests answered in time are not kept."""
    import random

    import httpx

    import timebound as tb
    from timebound.propagation.httpx import AsyncDeadlineTransport

    rng = random.Random(7)
    out: list[tuple[float, Any]] = []
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    transport = AsyncDeadlineTransport(httpx.AsyncHTTPTransport(limits=limits))
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(transport=transport) as client:

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                with tb.fail_after(CLIENT_DEADLINE):
                    await client.get(url, headers={"x-bench-id": str(i)})
            except tb.DeadlineExceeded as err:
                observed = (time.perf_counter() - t0) * 1e3
                bd = err.breakdown
                out.append((observed, bd))
            except httpx.HTTPError:
                pass

        loop = asyncio.get_running_loop()
        start = loop.time()
        t = 0.0
        i = 0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            await asyncio.sleep(max(0.0, start + t - loop.time()))
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.wait(tasks)
    return out


def chain_rows(quick: bool) -> list[Row]:
    """The rho = 2 run of the propagation chain with breakdowns exposed (see the docstring)."""
    import os

    import propagation as prop

    os.environ["TB_BENCH_EXPOSE_BREAKDOWN"] = "1"
    os.environ["TB_BENCH_RESERVE"] = RESERVE
    iters = prop.calibrate_iters()
    capacity = prop.measure_capacity(iters, QUANTA, 2.0, 0.5, roles="ABC")
    services = prop.start_chain("M4", iters, QUANTA)
    try:
        url = services["A"].url
        results = asyncio.run(_chain_load(url, 2.0 * capacity, 4.0 if quick else 10.0))
    finally:
        prop.stop_chain(services)
    timed_out = len(results)
    with_tree = [(obs, bd) for obs, bd in results if bd is not None]
    crossed = [(obs, bd) for obs, bd in with_tree if any(p.kind == "remote" for _, p in bd.walk())]
    gaps = sorted(abs(obs - sum(p.elapsed_ms for p in bd.parts)) for obs, bd in with_tree)
    p99_gap = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else float("nan")
    share = len(crossed) / timed_out if timed_out else float("nan")
    any_tree = len(with_tree) / timed_out if timed_out else float("nan")
    print(
        f"chain at rho 2 (reserve {RESERVE} on A and B): capacity {capacity:.0f}/s, "
        f"{timed_out} timed out, {len(with_tree)} with a breakdown, {len(crossed)} with A's side "
        f"in it; elapsed gap p99 {p99_gap:.2f} ms"
    )
    return [
        Row("breakdown.chain.rho2.timed_out", timed_out, "requests"),
        Row(
            "breakdown.chain.rho2.with_breakdown",
            any_tree,
            "share",
            target=">= 0.99",
            passed=any_tree >= 0.99,
        ),
        Row(
            "breakdown.chain.rho2.with_callee_side",
            share,
            "share",
            target=">= 0.99",
            passed=share >= 0.99,
        ),
        Row(
            "breakdown.chain.rho2.elapsed_gap_p99",
            p99_gap,
            "ms",
            target="<= 2 ms",
            passed=p99_gap <= 2.0,
        ),
    ]


CLIENT_DEADLINE = 0.250
#: A's and B's reserve (D1.18): time kept to answer before the caller gives up, sized for this
#: shared 2-core machine, where a process waits tens of milliseconds for a core under load.
RESERVE = "40ms"
#: Work quanta per request at C, as bench/propagation.py (80: ~40 ms of CPU per request).
QUANTA = 80


def measure(args: argparse.Namespace) -> list[Row]:
    rounds, n = pick(args, (7, 100_000), (3, 20_000), (1, 500))
    commit = base_commit()
    with tempfile.TemporaryDirectory() as tmp:
        base_src = base_tree(Path(tmp), commit)
        head_src = ROOT / "src"
        best: dict[str, dict[str, float]] = {"base": {}, "head": {}}
        for _ in range(rounds):
            for build, src in (("base", base_src), ("head", head_src)):
                for k, v in _measure_build(src, n).items():
                    best[build][k] = min(v, best[build].get(k, v))
    rows = []
    for k in ("scope", "policy_under_scope", "hop"):
        head, base = best["head"][k] * 1e6, best["base"][k] * 1e6
        checked = k in ("scope", "hop")
        rows.append(
            Row(
                metric=f"breakdown.{k}",
                value=head,
                unit="us/op",
                baseline=f"build without the breakdown ({commit[:7]})",
                baseline_value=base,
                target="<= 1.05x" if checked else None,
                passed=head <= 1.05 * base if checked else None,
            )
        )
    if not args.no_chain and not args.smoke:
        rows += chain_rows(args.quick)
    return rows


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-chain", action="store_true", help="skip the rho = 2 chain run")


if __name__ == "__main__":
    sys.exit(run_bench("breakdown", __doc__, measure, configure=_options))
