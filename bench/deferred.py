"""Deferred operations: accept latency, poll lateness at 10,000 pending, cadence, rate cap, restart.

Run: ``python bench/deferred.py --out bench/results/deferred.json`` (about two minutes a repeat;
``--quick`` for a smaller run). Prints a table; writes the results only with ``--out``.

Rows:
- ``accept_latency.p50/p99``: ``Service.start`` (the ``202`` answer's work: the durable insert
  on SQLite with ``synchronous=FULL``, one fsync per accept, and the task that runs the work).
  Baseline: a bare one-row INSERT transaction on the same kind of store.
- ``poll_lateness.p50/p99``: 10,000 pending operations on SQLite (``synchronous=NORMAL``), hints
  of 5-30 s, default jitter, a cap of 1,000 polls/s; an in-process connector answers ``pending``
  and records, for every poll, its lateness: the instant the connector is called minus the row's
  stored ``next_poll_ms`` as the poller read it, i.e. the instant the host scheduled (the last
  poll or the registration, plus the clamped and stretched interval, plus jitter). The rate cap
  and the in-flight limit spread polls by holding starts back, never by rewriting that instant,
  so any wait they add counts as lateness here. ``early`` counts polls before that instant (must
  be 0).
- ``poll_rate.peak``: the most poll starts in any one-second window, next to the cap. The
  arithmetic: 10,000 first polls spread over about 30 s plus the stretched second and third
  polls ask for a few hundred polls/s, under the cap of 1,000, so the cap does not have to hold
  polls back in this run; a peak near the cap means the poller was catching up after a stall
  (those polls' lateness is counted). 10,000 operations at a 1 s hint under the default cap of
  100/s could not all be polled every second: by this definition their lateness would grow
  without bound (a capacity question, not a lateness one).
- ``poll_cpu_per_poll``: the process CPU time of the run minus the CPU spent in ``register``,
  divided by the polls: the host's whole cost of a poll (the loop's queries, the connector call,
  validation, the store writes). Less sensitive to a loaded machine than lateness.
- ``rate_cap_violations``: one-second windows holding more poll starts than the cap (must be 0).
- ``polls_per_op_15min_1s_hint``: one operation answering ``pending`` with a 1 s hint for its
  whole 15-minute lifetime, on virtual time.
- ``restart_rearm``: the 10,000 operations left pending, a new process-equivalent opens the
  registry and starts the poller; time until its first round has re-armed everything from
  storage (the start-up expiry sweep and the first due-poll query).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import random
import sqlite3
import sys
import tempfile
import time
from typing import Any

from _common import MS, Row, percentile, pick, run_bench

from timebound.deferred import HostPolicy, Operation, Poller, Registry, Service
from timebound.deferred._contract import format_time
from timebound.deferred._registry import now_ms
from timebound.testing import VirtualClock


def _doc(op_id: str, retry_after: int, ttl_s: int) -> dict[str, Any]:
    created = now_ms()
    return {
        "schema": "deferred-operation.v1",
        "schema/v": 1,
        "status": "deferred",
        "operation/id": op_id,
        "operation/kind": op_id.split(":")[1],
        "retry_after_seconds": retry_after,
        "created_at": format_time(created),
        "expires_at": format_time(created + ttl_s * 1000),
        "status_href": f"/v1/deferred-operations/{op_id}/status",
        "cancel/unavailable-reason": "bench",
    }


class Recorder:
    """An in-process connector: answers pending, records lateness and poll starts."""

    def __init__(self, hint: int | None = None) -> None:
        self.hint = hint
        self.lateness_ms: list[int] = []
        self.starts: list[float] = []
        self.per_op: collections.Counter[str] = collections.Counter()

    async def status(self, op: Operation) -> object:
        at = now_ms()
        assert op.next_poll_ms is not None
        self.lateness_ms.append(at - op.next_poll_ms)
        self.starts.append(time.monotonic())
        self.per_op[op.id] += 1
        return {
            "schema": "deferred-operation-status.v1",
            "schema/v": 1,
            "operation/id": op.id,
            "operation/kind": op.kind,
            "status": "pending",
            "retry_after_seconds": self.hint if self.hint is not None else op.retry_after_s,
        }

    async def cancel(self, op: Operation) -> object:
        raise AssertionError("not used")


async def accept_latency(tmp: str, n: int) -> list[Row]:
    async with Registry(f"sqlite:///{tmp}/accept.db") as reg:
        service = Service(reg, max_running=n + 1)

        @service.operation("bench.job", ttl=900)
        async def job(payload: Any) -> Any:
            await asyncio.sleep(3600)

        times = []
        for i in range(n):
            t0 = time.perf_counter()
            await service.start("bench.job", {"i": i})
            times.append(time.perf_counter() - t0)
        await service.aclose()
    conn = sqlite3.connect(f"{tmp}/base.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT)")
    base = []
    for i in range(n):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"id{i}", "x" * 200))
        conn.execute("COMMIT")
        base.append(time.perf_counter() - t0)
    conn.close()
    base_name = "bare SQLite INSERT transaction (FULL)"
    return [
        Row(
            "accept_latency.p50",
            percentile(times, 50) * MS,
            "ms",
            base_name,
            percentile(base, 50) * MS,
        ),
        Row(
            "accept_latency.p99",
            percentile(times, 99) * MS,
            "ms",
            base_name,
            percentile(base, 99) * MS,
            "<= 50",
            percentile(times, 99) * MS <= 50,
        ),
    ]


async def lateness_and_restart(tmp: str, n: int, run_s: float) -> list[Row]:
    cap = 1000
    policy = HostPolicy(poll_rate_cap=cap, per_module_inflight=64)
    url = f"sqlite:///{tmp}/poll.db?synchronous=NORMAL"
    rng = random.Random(1)
    rec = Recorder()
    register_cpu = 0.0
    cpu0 = time.process_time()
    async with Registry(url, policy=policy) as reg, Poller(reg, {"m": rec}):
        # Accepted while the poller runs, as in a live host.
        for i in range(n):
            doc = _doc(f"deferred:bench.job:{i}", rng.randint(5, 30), 900)
            c0 = time.process_time()  # register does not suspend on SQLite: its own CPU only
            await reg.register(doc, module="m")
            register_cpu += time.process_time() - c0
            if i % 100 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(run_s)
    poll_cpu = time.process_time() - cpu0 - register_cpu
    starts = sorted(rec.starts)
    violations = 0
    peak = 0
    j = 0
    for i, t in enumerate(starts):  # windows [t, t + 1 s) starting at every poll
        while j < len(starts) and starts[j] - t < 1.0:
            j += 1
        peak = max(peak, j - i)
        if j - i > cap:
            violations += 1
    late = rec.lateness_ms
    early = sum(1 for x in late if x < 0)

    # Restart: every operation is still pending in storage; re-arm them from it.
    restart = Recorder()
    t0 = time.perf_counter()
    async with Registry(url, policy=policy) as reg:
        poller = Poller(reg, {"m": restart})
        await reg.expire_due(startup=True)
        await poller.step()
        rearm_s = time.perf_counter() - t0
        await poller.stop()
        async with reg.store.transaction() as tx:
            row = await tx.fetchone(
                "SELECT COUNT(*) AS n FROM tb_deferred_ops WHERE status = 'pending' "
                "AND next_poll_ms IS NOT NULL"
            )
    armed = 0 if row is None else int(row["n"])
    return [
        Row("poll_lateness.polls", float(len(late)), "polls"),
        Row("poll_lateness.p50", percentile(late, 50), "ms"),
        Row("poll_lateness.p99", percentile(late, 99), "ms", None, None, "<= 250",
            percentile(late, 99) <= 250),
        Row("poll_lateness.early", float(early), "count", None, None, "== 0", early == 0),
        Row("poll_rate.peak", float(peak), "polls/s", "poll_rate_cap", float(cap)),
        Row("poll_cpu_per_poll", poll_cpu / max(len(late), 1) * 1e6, "us"),
        Row("rate_cap_violations", float(violations), "windows", None, None, "== 0",
            violations == 0),
        Row("restart_rearm", rearm_s * MS, "ms", None, None, "<= 2000 (10,000 pending)",
            rearm_s <= 2.0 and armed == n),
    ]  # fmt: skip


def polls_per_op() -> Row:
    clock = VirtualClock()

    async def main() -> int:
        rec = Recorder(hint=1)
        with tempfile.TemporaryDirectory() as tmp:
            async with Registry(f"sqlite:///{tmp}/v.db") as reg:
                await reg.register(_doc("deferred:bench.job:one", 1, 900), module="m")
                async with Poller(reg, {"m": rec}):
                    await asyncio.sleep(1000)
        return rec.per_op["deferred:bench.job:one"]

    polls = clock.run(main())
    return Row(
        "polls_per_op_15min_1s_hint", float(polls), "polls", None, None, "<= 30", polls <= 30
    )


async def measured(n: int, accepts: int, run_s: float) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = await accept_latency(tmp, accepts)
        rows += await lateness_and_restart(tmp, n, run_s)
    return rows


def measure(args: argparse.Namespace) -> list[Row]:
    n, accepts, run_s = pick(args, (10_000, 1000, 60.0), (2000, 200, 20.0), (100, 20, 1.0))
    rows = asyncio.run(measured(n, accepts, run_s))
    rows.append(polls_per_op())  # on virtual time, outside the real loop
    for r in rows:
        if isinstance(r.value, float) and math.isnan(r.value) and not args.smoke:
            raise SystemExit(f"{r.metric}: no samples")
    return rows


if __name__ == "__main__":
    sys.exit(run_bench("deferred", __doc__, measure, title="deferred operations"))
