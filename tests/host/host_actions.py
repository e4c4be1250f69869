"""Handlers the host tests serve (imported by the server process as ``tests.host.host_actions``)."""

from __future__ import annotations

import asyncio
from typing import Any


async def work(ctx: Any) -> Any:
    """Sleeps ``input.sleep_s`` seconds (0 by default), then answers ``"ok"``."""
    await asyncio.sleep(ctx.input.get("sleep_s", 0) if ctx.input else 0)
    return "ok"


async def nap(ctx: Any) -> Any:
    """Inside a fan-out: sleeps the branch's item (seconds) and answers it."""
    await asyncio.sleep(ctx.branch["item"])
    return ctx.branch["item"]


def noop(ctx: Any) -> None:
    return None


async def start_render(ctx: Any) -> Any:
    """The first call of a deferred node: asks the render service (its URL in
    ``TB_TEST_RENDER_URL``) to start ``report.render`` and answers its deferred-operation.v1."""
    import os

    import httpx

    async with httpx.AsyncClient(base_url=os.environ["TB_TEST_RENDER_URL"]) as client:
        r = await client.post("/v1/operations/report.render", json={"pages": ctx.input["pages"]})
        return r.json()


async def logged(ctx: Any) -> Any:
    """Appends ``<run> <node> start`` and ``… end`` to the file ``TB_TEST_ACTION_LOG`` names,
    sleeping ``input.sleep[node]`` seconds in between on the node's first start only (a re-run
    after a restart answers at once)."""
    import os
    from pathlib import Path

    log = Path(os.environ["TB_TEST_ACTION_LOG"])
    mark = f"{ctx.run_id} {ctx.node_id}"
    seen = log.read_text().splitlines() if log.exists() else []
    with log.open("a") as f:
        f.write(f"{mark} start\n")
    if f"{mark} start" not in seen:
        await asyncio.sleep(ctx.input.get("sleep", {}).get(ctx.node_id, 0))
    with log.open("a") as f:
        f.write(f"{mark} end\n")
    return "ok"


async def flaky(ctx: Any) -> Any:
    """Fails its first ``input.fail`` attempts (after ``input.sleep_s``), then answers ``"ok"``."""
    await asyncio.sleep(ctx.input.get("sleep_s", 0))
    if ctx.attempt <= ctx.input.get("fail", 0):
        raise RuntimeError(f"flaky attempt {ctx.attempt}")
    return "ok"


async def watched(ctx: Any) -> Any:
    """Sleeps ``input.sleep_s``, appending ``<run> start`` and then ``<run> end`` or
    ``<run> cancelled`` to the file ``TB_TEST_ACTION_LOG`` names (which process stopped it)."""
    import os
    from pathlib import Path

    log = Path(os.environ["TB_TEST_ACTION_LOG"])
    with log.open("a") as f:
        f.write(f"{ctx.run_id} start {ctx.attempt}\n")
    try:
        await asyncio.sleep(ctx.input.get("sleep_s", 0))
    except asyncio.CancelledError:
        with log.open("a") as f:
            f.write(f"{ctx.run_id} cancelled {ctx.attempt}\n")
        raise
    with log.open("a") as f:
        f.write(f"{ctx.run_id} end {ctx.attempt}\n")
    return "ok"


def echo(ctx: Any) -> Any:
    """Answers ``input.output`` (a node whose output the test chooses, such as a trace)."""
    return ctx.input.get("output")


def _record_events() -> None:
    """With ``TB_TEST_EVENT_LOG`` set, the host process's telemetry listener appends each
    workflow event it hears, pickled (base64, one a line), to that file: what the listener heard
    in process, for a test to compare with what the wire carried."""
    import base64
    import os
    import pickle
    from pathlib import Path

    from timebound.telemetry import Event, add_listener

    path = os.environ.get("TB_TEST_EVENT_LOG")
    if not path:
        return
    log = Path(path)

    def record(event: Event) -> None:
        if event.kind == "workflow":
            with log.open("ab") as f:
                f.write(base64.b64encode(pickle.dumps(event)) + b"\n")

    add_listener(record)


_record_events()
