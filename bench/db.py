"""Database adapter benchmarks: what a query under a deadline costs (asyncpg, psycopg async).

Run: ``python bench/db.py --out bench/results/db.json`` (about half a minute a repeat; needs
PostgreSQL at 127.0.0.1:5432, database ``test``). Prints a table; writes the results only with
``--out``. Every variant runs on the same
connection kind against the same local server, interleaved, in the same run; the ratios to the
driver's own call are what matter (absolute times are mostly the local round trip).

Variants, each one ``INSERT`` of one row (a write, so ``COMMIT`` does real work). The sessions
run with ``synchronous_commit = off``: a WAL flush per commit on a shared machine is noise many
times larger than the round trips being measured, and the adapter adds none.

* ``plain`` — the driver's own call, autocommit (the baseline);
* ``no_deadline`` — through the adapter with no deadline in force (must cost nothing);
* ``own_tx`` — under a deadline, outside a transaction: ``BEGIN``+narrowing in one message,
  the statement, ``COMMIT``, all guarded against cancellation (two extra round trips);
* ``callers_tx`` — under a deadline inside the caller's transaction: narrowing, the
  statement, restoring (two extra round trips), against the same statement in a transaction
  without a deadline;
* ``client_timeout`` (asyncpg) — the alternative design, asyncpg's own per-call ``timeout=``:
  no extra round trip, but a cut cancels from the client side (a second connection to send a
  CancelRequest) and a cancelling scope still races the driver.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from _common import US, Row, pick, run_bench

import timebound as tb

DSN = "postgresql://postgres@127.0.0.1:5432/test"
SESSION = "SET synchronous_commit = off"
ROUNDS = 7
N = 400
SLICE = 10


async def _per_call(body: Callable[[], Awaitable[Any]], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await body()
    return (time.perf_counter() - start) / n


async def _interleave(variants: dict[str, Callable[[], Awaitable[Any]]]) -> dict[str, float]:
    """Per-call seconds per variant: the variants take turns in slices of ``SLICE`` calls, so a
    busy moment of the shared machine hits them all alike; median over rounds."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        slices: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(N // SLICE):
            for name, body in variants.items():
                slices[name].append(await _per_call(body, SLICE))
        for name, values in slices.items():
            # The lower half of the slices: those no other process interrupted.
            values.sort()
            samples[name].append(statistics.mean(values[: max(1, len(values) // 2)]))
    return {name: statistics.median(values) for name, values in samples.items()}


def _deadline() -> tb.Deadline:
    return tb.Deadline.after(30)


async def _asyncpg_rows() -> list[Row]:
    import asyncpg

    from timebound.propagation.asyncpg import connect

    table = f"tb_bench_{uuid.uuid4().hex[:10]}"
    ours = await connect(DSN)
    # The baseline is asyncpg's own method on the very same connection (same backend).
    driver = asyncpg.Connection
    await ours.execute(SESSION)
    await ours.execute(f"CREATE TABLE {table} (id int)")
    insert = f"INSERT INTO {table} VALUES ($1)"

    async def under_deadline() -> None:
        with tb.inherit_deadline(_deadline()):
            await ours.execute(insert, 1)

    async def in_tx_plain() -> None:
        await driver.execute(ours, "BEGIN")
        await driver.execute(ours, insert, 1)
        await driver.execute(ours, "COMMIT")

    async def in_tx_plain5() -> None:
        await driver.execute(ours, "BEGIN")
        await driver.execute(ours, "SELECT 1")
        await driver.execute(ours, insert, 1)
        await driver.execute(ours, "SELECT 1")
        await driver.execute(ours, "COMMIT")

    async def in_tx_ours() -> None:
        await driver.execute(ours, "BEGIN")
        with tb.inherit_deadline(_deadline()):
            await ours.execute(insert, 1)
        await driver.execute(ours, "COMMIT")

    variants: dict[str, Callable[[], Awaitable[Any]]] = {
        "plain": lambda: driver.execute(ours, insert, 1),
        "no_deadline": lambda: ours.execute(insert, 1),
        "own_tx": under_deadline,
        "client_timeout": lambda: driver.execute(ours, insert, 1, timeout=30),
        "tx_plain": in_tx_plain,
        "tx_plain5": in_tx_plain5,
        "callers_tx": in_tx_ours,
    }
    try:
        # Every message exchange asyncpg makes passes its query logger once (the narrowing sent
        # with BEGIN as one message, too).
        logged: list[object] = []
        ours.add_query_logger(logged.append)
        trips = {}
        for name, body in variants.items():
            logged.clear()
            await body()
            await asyncio.sleep(0)  # the logger is called soon after each exchange, not in it
            trips[name] = len(logged)
        ours.remove_query_logger(logged.append)
        t = await _interleave(variants)
    finally:
        await ours.execute(f"DROP TABLE {table}")
        await ours.close()
    return _rows("asyncpg", t, trips)


async def _psycopg_rows() -> list[Row]:
    import psycopg

    from timebound.propagation.psycopg import aconnect

    table = f"tb_bench_{uuid.uuid4().hex[:10]}"
    ours = await aconnect(DSN, autocommit=True)
    # The baseline is psycopg's own cursor on the very same connection (same backend).
    driver = psycopg.AsyncCursor(ours)
    cur = ours.cursor()  # an AsyncDeadlineCursor, reused as ``driver`` is
    await ours.execute(SESSION)
    await ours.execute(f"CREATE TABLE {table} (id int)")
    insert = f"INSERT INTO {table} VALUES (%s)"

    async def under_deadline() -> None:
        with tb.inherit_deadline(_deadline()):
            await cur.execute(insert, (1,))

    async def in_tx_plain() -> None:
        await driver.execute("BEGIN")
        await driver.execute(insert, (1,))
        await driver.execute("COMMIT")

    async def in_tx_plain5() -> None:
        await driver.execute("BEGIN")
        await driver.execute("SELECT 1")
        await driver.execute(insert, (1,))
        await driver.execute("SELECT 1")
        await driver.execute("COMMIT")

    async def in_tx_ours() -> None:
        await driver.execute("BEGIN")
        with tb.inherit_deadline(_deadline()):
            await cur.execute(insert, (1,))
        await driver.execute("COMMIT")

    variants: dict[str, Callable[[], Awaitable[Any]]] = {
        "plain": lambda: driver.execute(insert, (1,)),
        "no_deadline": lambda: cur.execute(insert, (1,)),
        "own_tx": under_deadline,
        "tx_plain": in_tx_plain,
        "tx_plain5": in_tx_plain5,
        "callers_tx": in_tx_ours,
    }
    try:
        trips = {name: await _psycopg_trips(body) for name, body in variants.items()}
        t = await _interleave(variants)
    finally:
        await ours.execute(f"DROP TABLE {table}")
        await ours.close()
    return _rows("psycopg_async", t, trips)


async def _psycopg_trips(body: Callable[[], Awaitable[Any]]) -> int:
    """Round trips of one call: every query psycopg's async cursor executes (the adapter's
    statement and its bookkeeping alike) is one exchange outside pipeline mode."""
    import psycopg

    base = psycopg.AsyncCursor.execute
    count = 0

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        return await base(self, *args, **kwargs)

    psycopg.AsyncCursor.execute = counting  # type: ignore[method-assign]
    try:
        await body()
    finally:
        psycopg.AsyncCursor.execute = base  # type: ignore[method-assign]
    return count


def _rows(driver: str, t: dict[str, float], trips: dict[str, int]) -> list[Row]:
    """Round trips (exact: the design's cost), and time per call.

    Time is judged against the driver making the same number of round trips itself (``BEGIN``,
    the ``INSERT``, ``COMMIT``; with two ``SELECT 1`` more for five), so the ratio shows what
    the adapter adds beyond its round trips: the guard task and the narrowing's server work.
    The rows against the plain autocommit ``INSERT`` are the whole price, for reference.
    """
    p = f"db.{driver}"
    rows: list[Row] = []
    for name, base, most in (
        ("no_deadline", "plain", 1.0),
        ("own_tx", "plain", 3.0),
        ("callers_tx", "tx_plain", 5 / 3),
    ):
        rows.append(
            Row(
                f"{p}.{name}.round_trips",
                trips[name],
                "round trips",
                base,
                trips[base],
                f"<= {most:.3g}x {base}",
                trips[name] <= most * trips[base],
            )
        )
    same_trips = {"no_deadline": ("plain", 1.1), "own_tx": ("tx_plain", 1.5)}
    same_trips["callers_tx"] = ("tx_plain5", 1.5)
    for name, (base, most) in same_trips.items():
        assert trips[name] == trips[base], (name, trips)
        rows.append(
            Row(
                f"{p}.{name}.time",
                t[name] * US,
                "us",
                base,
                t[base] * US,
                f"<= {most:.3g}x {base}",
                t[name] <= most * t[base],
            )
        )
    rows.append(Row(f"{p}.own_tx.time_vs_plain", t["own_tx"] * US, "us", "plain", t["plain"] * US))
    rows.append(
        Row(
            f"{p}.callers_tx.time_vs_tx", t["callers_tx"] * US, "us", "tx_plain", t["tx_plain"] * US
        )
    )
    if "client_timeout" in t:
        rows.append(
            Row(
                f"{p}.client_timeout.time", t["client_timeout"] * US, "us", "plain", t["plain"] * US
            )
        )
    return rows


async def _guard_rows() -> list[Row]:
    """What the guard itself costs: a statement run through ``run_guarded`` (its own task, the
    caller waiting on it) against the same coroutine awaited directly, no I/O."""
    from timebound.propagation._client import AttemptTimeoutBase, begin
    from timebound.propagation.db._common import Guard, options, run_guarded

    # An attempt under a deadline, as a guarded call has one (its statement checks it).
    with tb.inherit_deadline(tb.Deadline.after(3600)):
        attempt = begin(None, options("bench", "bench"), AttemptTimeoutBase)

    async def statement() -> None:
        await asyncio.sleep(0)

    async def guarded(guard: Guard) -> None:
        await guard.statement(statement)

    async def through_guard() -> None:
        await run_guarded(guarded, attempt, grace=1.0)

    t = await _interleave({"direct": statement, "guarded": through_guard})
    return [Row("db.guard.time", t["guarded"] * US, "us", "direct", t["direct"] * US)]


def measure(args: argparse.Namespace) -> list[Row]:
    global ROUNDS, N
    ROUNDS, N = pick(args, (7, 400), (3, 100), (1, 20))

    async def main() -> list[Row]:
        return await _guard_rows() + await _asyncpg_rows() + await _psycopg_rows()

    return asyncio.run(main())


if __name__ == "__main__":
    sys.exit(run_bench("db", __doc__, measure, title="database adapters: one INSERT, per call"))
