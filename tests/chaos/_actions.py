"""Handlers for the chaos workers: each node sleeps as long as the run's input says."""

from __future__ import annotations

import asyncio
from typing import Any


async def work(ctx: Any) -> dict[str, Any]:
    await asyncio.sleep(ctx.input["ms"][ctx.node_id] / 1000)
    return {"node": ctx.node_id}
