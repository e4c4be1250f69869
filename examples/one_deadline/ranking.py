"""The ranking pipeline behind the ``Rank`` module (docs/pipeline.md).

The enrichment step (``fetch_features``) is slow today: it needs 120 ms, but the
``timeout_wrapper`` region gives the whole enrichment sub-chain a budget of 5 ms + 100 us per row,
so the region's deadline fires first, the overlay is rolled back and the fail branch fills the
defaults. The ranking still answers, in popularity order, well inside the request's deadline.
"""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pyarrow.compute as pc

from timebound import pipeline as pl

FEATURE_LATENCY_S = 0.12

registry = pl.Catalog()
registry.key("id", pa.int64())
registry.key("popularity", pa.float64())
registry.key("f_personal", pa.float64(), nullable=True)
registry.key("score", pa.float64(), default=0.0)


@registry.task(reads=["id"], writes=["f_personal"])
async def fetch_features(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
    """A personalisation feature store: slow today."""
    await asyncio.sleep(FEATURE_LATENCY_S)
    return {"f_personal": pc.multiply(rows["id"], 1.5).cast(pa.float64()).combine_chunks()}


plan = pl.Plan("rank_showcase", catalog=registry)
plan.timeout_wrapper(
    if_success=lambda c: c.task("fetch_features"),
    if_fail=lambda c: c.fill_defaults(["f_personal"]),
    budget={"base_ms": 5, "per_row_us": 100, "min_ms": 1, "max_ms": 50},
    on_timeout="fallback",
).vm("score", pl.col("popularity") + pl.col("f_personal").fill_null(0.0)).sort(
    "score", descending=True
).take(3)

artifact = pl.compile(plan)
engine = pl.Engine(registry, env="prod")

CANDIDATES = pa.table(
    {
        "id": pa.array([101, 102, 103, 104, 105], type=pa.int64()),
        "popularity": pa.array([3.0, 9.0, 1.0, 7.0, 5.0], type=pa.float64()),
    }
)


async def rank() -> tuple[list[int], dict[str, object]]:
    """Rank the candidates; returns the top ids and the wrapper's trace record."""
    result = await engine.run(artifact, CANDIDATES)
    wrapper = dict(result.trace.wrappers["timeout_wrapper"])
    return result.rows.column("id").to_pylist(), wrapper
