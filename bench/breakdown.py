"""What the breakdown costs (D13.8): this tree against the build without it, in the same run.

The build without it is ``src/`` at the merge base of this branch and ``main`` (``git archive``
into a temporary directory). Each measurement runs in a child process per build, the builds
interleaved, the best of the rounds kept:

- ``scope``: entering and leaving ``fail_after(1)`` around an ``await`` in a task (the
  per-request scope; records nothing, pays the exit's one test);
- ``policy_under_scope``: a policy call with an attempt timeout under a request scope (records
  one attempt per call: the per-call price of the breakdown);
- ``hop``: one request through ``DeadlineMiddleware`` (``expose_breakdown=True`` in this tree)
  whose handler calls a downstream service through ``AsyncDeadlineTransport``, in process
  (httpx's ``MockTransport`` as the downstream: no sockets, so the hop's own code is what is
  measured, not the loopback's noise).

``python bench/breakdown.py`` writes ``bench/results/breakdown.json``; ``--quick`` runs fewer
rounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Row, print_table, write_results

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, inspect, json, sys, time
import httpx
import timebound
from timebound.policies import Policy
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport

N = int(sys.argv[1])
EXPOSE = "expose_breakdown" in inspect.signature(DeadlineMiddleware).parameters


async def scope() -> float:
    t = time.perf_counter()
    for _ in range(N):
        with timebound.fail_after(1):
            await asyncio.sleep(0)
    return (time.perf_counter() - t) / N


async def nothing() -> int:
    return 1


async def policy_under_scope() -> float:
    p = Policy("p", timeout="1s", retry=2)
    t = time.perf_counter()
    for _ in range(N):
        with timebound.fail_after(1):
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
            (b"x-yataxi-client-timeoutms", b"1000")
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


def base_tree(tmp: Path) -> Path:
    base = subprocess.run(
        ["git", "merge-base", "HEAD", "main"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", base, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp / "src"


def measure(src: Path, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n)],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    args = parser.parse_args()
    rounds, n = (3, 20_000) if args.quick else (7, 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        base_src = base_tree(Path(tmp))
        head_src = ROOT / "src"
        best: dict[str, dict[str, float]] = {"base": {}, "head": {}}
        for _ in range(rounds):
            for build, src in (("base", base_src), ("head", head_src)):
                for k, v in measure(src, n).items():
                    best[build][k] = min(v, best[build].get(k, v))
    rows = []
    for k in ("scope", "policy_under_scope", "hop"):
        head, base = best["head"][k] * 1e6, best["base"][k] * 1e6
        rows.append(
            Row(
                metric=f"breakdown.{k}",
                value=head,
                unit="us/op",
                baseline="build without the breakdown (merge base)",
                baseline_value=base,
                target="<= 1.05x" if k in ("scope", "hop") else None,
                passed=head <= 1.05 * base if k in ("scope", "hop") else None,
            )
        )
    print_table(rows, "where the budget went: cost against the build without it")
    print(f"wrote {write_results('breakdown', rows)}")


if __name__ == "__main__":
    main()
