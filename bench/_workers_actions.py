"""Handlers run by the ``timebound worker`` processes of ``bench/workflow.py``'s multi-process
rows. Starts and cancellations are appended, with the wall-clock instant (epoch ms) and the
process id, to the file ``TB_BENCH_LOG`` names."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any


def _log(what: str, ctx: Any) -> None:
    line = f"{what} {ctx.run_id} {ctx.token_id} {time.time() * 1000:.3f} {os.getpid()}\n"
    fd = os.open(os.environ["TB_BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def step(ctx: Any) -> int:
    return int(ctx.attempt)


async def slow(ctx: Any) -> None:
    """Logs its start, sleeps an hour, logs its cancellation."""
    _log("start", ctx)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _log("cancelled", ctx)
        raise


async def nap(ctx: Any) -> Any:
    """Inside a fan-out: logs its start, sleeps the branch's item (seconds), logs its end or
    its cancellation."""
    _log("start", ctx)
    try:
        await asyncio.sleep(ctx.branch["item"])
    except asyncio.CancelledError:
        _log("cancelled", ctx)
        raise
    return ctx.branch["item"]
