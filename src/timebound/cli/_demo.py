"""timebound demo: a short, real demonstration printed as a timeline.

Three scenes, each on the real clock (about a second in all): nested deadlines, a retry under a
total budget, and a fallback. Every line is an event that really happened, with its offset from
the start of the scene.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import timebound as tb
from timebound.telemetry import Timeline, add_listener

__all__ = ["register"]


class _Timeline(Timeline):
    """The one event timeline (``+  123.4 ms  what happened``), restarted at each scene."""

    def scene(self, title: str) -> None:
        self.restart()
        print(f"\n== {title}", file=self.out)


async def _scene_nested(tl: _Timeline) -> None:
    tl.scene("Nested deadlines: the earliest bound wins, and the scope that fired is reported")
    try:
        async with tb.fail_after(0.3) as request:
            tl.say(f"request scope entered, {tb.remaining() * 1000:.0f} ms left")
            async with tb.move_on_after(1.0) as step:
                tl.say(
                    f"inner step asks for 1000 ms but sees {tb.remaining() * 1000:.0f} ms "
                    "(min of every enclosing bound)"
                )
                await asyncio.sleep(10)
    except tb.DeadlineExceeded as exc:
        tl.say(f"DeadlineExceeded(source={exc.source!r}): {exc}")
        tl.say(f"request.expired={request.expired}, inner step.expired={step.expired}")


async def _scene_retry(tl: _Timeline) -> None:
    tl.scene("Retry under a total budget: attempts and delays must fit the deadline")
    calls = {"n": 0}

    @tb.resilient(
        name="flaky",
        retry=3,
        delay="40ms",
        backoff="exponential",
        timeout="100ms",
        total_timeout="400ms",
    )
    async def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionError(f"connection reset (call {calls['n']})")
        return "ok"

    tl.say(f"flaky() returned {await flaky()!r} after {calls['n']} calls")

    tl.scene("A budget that cannot fit another attempt: stop at once, without sleeping")

    @tb.resilient(name="slow", retry=5, delay="100ms", timeout="100ms", total_timeout="350ms")
    async def slow() -> str:
        await asyncio.sleep(1)
        return "never"

    try:
        await slow()
    except tb.DeadlineExceeded as exc:
        tl.say(
            f"stopped without sleeping: DeadlineExceeded(source={exc.source!r}) "
            f"— the next delay + attempt could not fit the 350 ms budget"
        )


async def _scene_fallback(tl: _Timeline) -> None:
    tl.scene("Fallback: evaluated once, after every attempt failed")

    @tb.resilient(name="recommendations", timeout="80ms", retry=1, fallback=["bestsellers"])
    async def recommendations(user: str) -> list[str]:
        await asyncio.sleep(random.uniform(0.2, 0.3))
        return [f"personal picks for {user}"]

    tl.say(f"recommendations('ada') -> {await recommendations('ada')!r}")


async def _demo(out: TextIO) -> None:
    tl = _Timeline(out)
    remove: Callable[[], None] = add_listener(tl)
    try:
        await _scene_nested(tl)
        await _scene_retry(tl)
        await _scene_fallback(tl)
    finally:
        remove()
    print("\nEvery bound above came from one deadline model: see docs/deadlines.md.", file=out)


def _showcase_script() -> Path | None:
    """``examples/one_deadline/showcase.py`` of the source tree: the current directory's, else
    the one this package was installed from (an editable install of a clone)."""
    here = Path(__file__).resolve().parents[3]
    for root in (Path.cwd(), here):
        script = root / "examples" / "one_deadline" / "showcase.py"
        if script.is_file():
            return script
    return None


def _run_showcase(keep: bool, port: int | None) -> int:
    script = _showcase_script()
    if script is None:
        # The showcase is an example program, not part of the package: it ships with the sources.
        print(
            "timebound demo --showcase: examples/one_deadline/showcase.py not found; run it from "
            "a clone of the timebound repository",
            file=sys.stderr,
        )
        return 2
    main = runpy.run_path(str(script))["main"]
    argv = ["--keep"] if keep else []
    if port is not None:
        argv += ["--port", str(port)]
    return int(main(argv))


def _run(args: argparse.Namespace) -> int:
    if args.port is not None and not args.keep:
        print("timebound demo: --port only applies with --showcase --keep", file=sys.stderr)
        return 2
    if args.port is not None and not 0 <= args.port <= 65535:
        print(f"timebound demo: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
        return 2
    if args.showcase:
        return _run_showcase(args.keep, args.port)
    if args.keep:
        print("timebound demo: --keep only applies with --showcase", file=sys.stderr)
        return 2
    asyncio.run(_demo(sys.stdout))
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="show nested deadlines, a retry under a total budget and a fallback, as a timeline",
        description=__doc__,
    )
    parser.add_argument(
        "--showcase",
        action="store_true",
        help="one 300 ms deadline across services, Constellation, a pipeline, a workflow and a "
        "deferred operation (examples/one_deadline)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="with --showcase: then serve the runs in the host UI until Ctrl-C or SIGTERM",
    )
    parser.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="with --showcase --keep: the host's port (default 8080; 0 picks a free one)",
    )
    parser.set_defaults(handler=_run)
