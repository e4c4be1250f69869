"""A worker for the kill -9 tests: runs (or resumes) one workflow run, logging to a side file.

argv: DB_URL SIDE_LOG KILL_POINT [RUN_ID]. Every handler start and finish is appended (and
fsynced) to SIDE_LOG before it happens, so the log survives a kill. KILL_POINT names where the
process kills itself with SIGKILL: ``none``, or ``<node>:<branch>:<start|end>`` (end: after the
handler computed its result, before the engine stored it). It prints the run id, then waits.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from timebound import workflow as wf

DEFINITION: dict[str, Any] = {
    "id": "crash",
    "timeout_ms": 120_000,
    "initial_node": "A",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [
        {"id": "A", "action_id": "work"},
        {"id": "B", "action_id": "work", "timeout_ms": 30_000},
        {"id": "C", "action_id": "work"},
        {"id": "D", "action_id": "work"},
    ],
    "transitions": [
        {"id": "fan", "from": "A", "to": "B", "spawn_count": 4},
        {"id": "join", "from": "B", "to": "C", "synchronization": {
            "strategy": "all", "sibling_group": "fan", "timeout_ms": 60_000,
            "merge": {"source": "_branch.output", "target": "state.results", "strategy": "append"},
        }},
        {"id": "cd", "from": "C", "to": "D"},
    ],
}  # fmt: skip


def main() -> None:
    url, side_log, kill_point = sys.argv[1:4]
    run_id = sys.argv[4] if len(sys.argv) > 4 else None
    fd = os.open(side_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(**entry: Any) -> None:
        os.write(fd, (json.dumps(entry) + "\n").encode())
        os.fsync(fd)

    def maybe_die(node: str, branch: Any, where: str) -> None:
        if kill_point == f"{node}:{branch}:{where}":
            os.kill(os.getpid(), signal.SIGKILL)

    async def work(ctx: wf.ActionContext) -> Any:
        branch = None if ctx.branch is None else ctx.branch["index"]
        log(event="start", node=ctx.node_id, branch=branch, pid=os.getpid())
        maybe_die(ctx.node_id, branch, "start")
        await asyncio.sleep(0.02)
        maybe_die(ctx.node_id, branch, "end")
        log(event="end", node=ctx.node_id, branch=branch, pid=os.getpid())
        return {"node": ctx.node_id, "branch": branch}

    async def go() -> None:
        engine = wf.Engine(db=url, actions={"work": work}, lease="300ms", sweep="50ms")
        engine.register(DEFINITION)
        async with engine:
            rid = run_id or await engine.start("crash", {})
            print(rid, flush=True)
            result = await engine.wait(rid)
            print(json.dumps(result._asdict()), flush=True)

    asyncio.run(go())


if __name__ == "__main__":
    main()
