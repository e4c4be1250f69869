"""A ranking plan like docs/pipeline.md's, in a module so another process can compile it."""

from __future__ import annotations

from typing import Any

import anyio
import pyarrow as pa
import pyarrow.compute as pc

from timebound import pipeline as pl


def make_registry(**delays: float) -> pl.Catalog:
    """The plan's catalog; ``delays`` are the (virtual) seconds a task sleeps, 1 ms each
    unless given."""
    delay = {"call_models": 0.001, "fetch_features": 0.001, **delays}
    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("score_model", pa.float64(), nullable=True)
    reg.key("score_final", pa.float64(), default=0.0)
    reg.key("f_esr", pa.float64(), nullable=True)
    reg.key("f_lsr", pa.float64(), nullable=True)
    reg.param("stage", pa.string(), default="esr")
    reg.param("override_budget_ms", pa.int64())

    @reg.task(reads=["id"], writes=["score_model"])
    async def call_models(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        await anyio.sleep(delay["call_models"])
        return {"score_model": pc.multiply(rows["id"], 0.5).cast(pa.float64()).combine_chunks()}

    @reg.task(reads=["id"], writes=pl.Switch("stage", {"esr": ["f_esr"], "lsr": ["f_lsr"]}))
    async def fetch_features(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        await anyio.sleep(delay["fetch_features"])
        key = "f_esr" if ctx.params["stage"] == "esr" else "f_lsr"
        return {key: pc.add(rows["id"], 0.25).cast(pa.float64()).combine_chunks()}

    return reg


def make_plan(reg: pl.Catalog, on_timeout: str = "fallback") -> pl.Plan:
    plan = pl.Plan("rank_v1", catalog=reg, params={"override_budget_ms": 10})
    plan.task("call_models").timeout_wrapper(
        if_success=lambda c: c.task("fetch_features", stage="esr").task("call_models"),
        if_fail=lambda c: c.fill_defaults(["f_esr", "score_model"]),
        budget={"base_ms": 2, "per_row_us": 20, "min_ms": 1, "max_ms": 15},
        override={
            "param": "override_budget_ms",
            "allow_sources": ["plan", "fragment"],
            "min_ms": 1,
            "max_ms": 20,
            "combine": "min",
        },
        on_timeout=on_timeout,
    ).vm("score_final", pl.col("score_model").fill_null(0.0) + 1.0)
    return plan


def rows(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), type=pa.int64())})


if __name__ == "__main__":
    import sys

    sys.stdout.buffer.write(pl.compile(make_plan(make_registry())).to_json())
