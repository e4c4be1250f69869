"""Handlers of the multi-process worker tests: each start and each cancellation is appended,
with the wall-clock instant, to the file ``TB_TEST_STOP_LOG`` names (one line per write, so
lines of several processes never mix)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any


def _log(what: str, ctx: Any) -> None:
    line = (
        f"{what} {ctx.run_id} {ctx.token_id} {ctx.node_id} {time.time() * 1000:.1f} {os.getpid()}\n"
    )
    fd = os.open(os.environ["TB_TEST_STOP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def _sleep(ctx: Any, seconds: float) -> None:
    _log("start", ctx)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _log("cancelled", ctx)
        raise
    _log("end", ctx)


async def slow(ctx: Any) -> str:
    """Sleeps ``input.sleep_s`` seconds (30 by default)."""
    await _sleep(ctx, (ctx.input or {}).get("sleep_s", 30))
    return "ok"


async def nap(ctx: Any) -> Any:
    """Inside a fan-out: sleeps the branch's item (seconds) and answers it."""
    await _sleep(ctx, ctx.branch["item"])
    return ctx.branch["item"]


async def flaky(ctx: Any) -> str:
    """First start: sleeps (the test kills its worker); second: fails; then answers."""
    _log("start", ctx)
    starts = sum(
        1
        for line in Path(os.environ["TB_TEST_STOP_LOG"]).read_text().splitlines()
        if line.startswith("start ") and line.split()[2] == ctx.token_id
    )
    if starts == 1:
        await asyncio.sleep(60)
    if starts == 2:
        raise RuntimeError("second start fails")
    return "ok"


def step_a(ctx: Any) -> str:
    return "a"


def step_b(ctx: Any) -> str:
    return "b"


def step_c(ctx: Any) -> str:
    return "c"
