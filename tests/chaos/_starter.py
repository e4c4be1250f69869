"""Starts the chaos runs: argv DB_URL RUNS SEED RATE; prints one run id per line, then "started".

It starts them through an engine of its own (concurrency 1, so it also works a little, like any
live worker) at RATE runs per second, and keeps working until it is stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _actions

from timebound import workflow as wf

# A -> B -> C; B has its own timeout, the run has one; the sleeps decide which bound fires.
DEFINITION: dict[str, Any] = {
    "id": "chaos",
    "timeout_ms": 3_000,
    "initial_node": "A",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [
        {"id": "A", "action_id": "work"},
        {"id": "B", "action_id": "work", "timeout_ms": 400},
        {"id": "C", "action_id": "work"},
    ],
    "transitions": [{"id": "ab", "from": "A", "to": "B"}, {"id": "bc", "from": "B", "to": "C"}],
}


def sleeps(rng: random.Random) -> dict[str, int]:
    """Mostly quick nodes; B sometimes outlives its 400 ms, C sometimes outlives the run."""
    b = rng.choice([rng.randint(0, 300), rng.randint(0, 300), rng.randint(500, 900), 10_000])
    c = rng.choice([rng.randint(0, 100)] * 3 + [10_000])
    return {"A": rng.randint(0, 100), "B": b, "C": c}


async def main(url: str, runs: int, seed: int, rate: float) -> None:
    rng = random.Random(seed)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    engine = wf.Engine(db=url, actions=_actions, concurrency=1, sweep="200ms")
    engine.register(DEFINITION)
    async with engine:
        for _ in range(runs):
            while True:
                try:  # the server may be restarting: starting a run is retried, never doubled
                    run_id = await engine.start("chaos", {"ms": sleeps(rng)})
                    break
                except Exception as exc:
                    print(f"retry start: {exc!r}", file=sys.stderr, flush=True)
                    await asyncio.sleep(0.2)
            print(run_id, flush=True)
            await asyncio.sleep(1 / rate)
        print("started", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
