"""``timebound workflow schema|validate|run`` and ``timebound worker``: durable workflows.

Exit codes: 0 completed (or valid); 1 failed (or invalid); 2 bad usage (unreadable file, module
that cannot be imported, bad ``--input``); 3 timed out; 4 cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, TextIO

from .. import ConfigurationError, to_seconds
from ..lowlevel import load_module
from ..telemetry import Event, Timeline, add_listener
from ..workflow import DefinitionError, Engine, StoreError, parse_definition, schema

__all__ = ["register"]

_EXIT = {"completed": 0, "failed": 1, "timed_out": 3, "cancelled": 4}


class _Usage(Exception):
    """Bad command-line usage: message printed, exit code 2."""


def register(sub: Any) -> None:
    wf = sub.add_parser("workflow", help="validate and run durable workflow definitions")
    wf_sub = wf.add_subparsers(dest="workflow_command", metavar="SUBCOMMAND")
    wf_sub.required = True
    p = wf_sub.add_parser("schema", help="print the JSON Schema of workflow definitions")
    p.set_defaults(handler=_schema)
    p = wf_sub.add_parser("validate", help="check a definition (JSON or YAML)")
    p.add_argument("file")
    p.set_defaults(handler=_validate)
    p = wf_sub.add_parser("run", help="run a definition to its end, showing tokens as they move")
    p.add_argument("file")
    p.add_argument("--actions", required=True, help="module (or FILE.py) of python handlers")
    p.add_argument("--db", help="store URL (default: a temporary SQLite file)")
    p.add_argument("--input", default="null", help="the run's input, as JSON")
    p.set_defaults(handler=_run)
    w = sub.add_parser("worker", help="work on a store's runs until interrupted")
    w.add_argument("--db", required=True, help="store URL (postgresql://… for many workers)")
    w.add_argument("--actions", required=True, help="module (or FILE.py) of python handlers")
    w.add_argument(
        "--lease",
        default="30s",
        help="how long a claimed step is this worker's without a heartbeat (e.g. 30s): the "
        "fallback when the worker is alive but stuck; a dead worker's steps are re-run in "
        "seconds whatever the lease (default 30s)",
    )
    w.add_argument("--concurrency", type=int, default=64, help="steps run at once (default 64)")
    w.set_defaults(handler=_worker)


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(schema(), indent=2))
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        d = parse_definition(Path(args.file))
    except DefinitionError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid (workflow {d.id!r} version {d.version}, {len(d.nodes)} nodes)")
    return 0


def _load_actions(spec: str) -> types.ModuleType:
    try:
        return load_module(spec, what="--actions")
    except ConfigurationError as exc:
        raise _Usage(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    try:
        actions = _load_actions(args.actions)
        try:
            run_input = json.loads(args.input)
        except ValueError as exc:
            raise _Usage(f"--input is not JSON: {exc}") from exc
    except _Usage as exc:
        print(f"timebound workflow run: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{tmp}/runs.db"
        try:
            engine = Engine(db=db, actions=actions)
            definition = engine.register(Path(args.file))
        except DefinitionError as exc:
            print(f"{args.file}: {exc}", file=sys.stderr)
            return 1
        status = asyncio.run(_run_and_show(engine, definition.id, run_input, sys.stdout))
    return _EXIT[status]


async def _run_and_show(engine: Engine, definition_id: str, run_input: Any, out: TextIO) -> str:
    # The run's events as the engine commits them (D10.3), in the one timeline (D10.6a). They
    # may arrive before start() returns the run's id: kept until it is known.
    run_id: str | None = None
    early: list[Event] = []
    timeline = Timeline(out)

    def show(event: Event) -> None:
        if event.kind != "workflow":
            return
        if run_id is None:
            early.append(event)
        elif event.correlation.get("run") == run_id:
            timeline(event)

    remove = add_listener(show)
    try:
        async with engine:
            run_id = await engine.start(definition_id, run_input)
            print(f"run {run_id}", file=out)
            for event in early:
                show(event)
            result = await engine.wait(run_id)
    finally:
        remove()
    print(f"status: {result.status}", file=out)
    if result.error:
        print(f"error: {result.error}", file=out)
    if result.output is not None:
        print(json.dumps(result.output, indent=2, sort_keys=True), file=out)
    return result.status


def _worker(args: argparse.Namespace) -> int:
    try:
        actions = _load_actions(args.actions)
        lease = to_seconds(args.lease, option="--lease")
        if lease <= 0 or args.concurrency < 1:
            raise _Usage("--lease must be > 0 and --concurrency >= 1")
    except (_Usage, ConfigurationError) as exc:
        print(f"timebound worker: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            pause = 0.1
            while not stop.is_set():
                engine = Engine(
                    db=args.db, actions=actions, lease=lease, concurrency=args.concurrency
                )
                try:
                    await engine.open()
                except StoreError as exc:
                    if not exc.unreachable:
                        raise  # refused by the server (a name, a password): waiting won't help
                    # Unreachable (a server restarting, a network partition): a worker started
                    # meanwhile waits for it, as a running worker's turns do (D6.22).
                    print(f"timebound worker: {exc}; trying again", file=sys.stderr, flush=True)
                    with contextlib.suppress(TimeoutError):  # never wait_for (D12.1)
                        async with asyncio.timeout(pause):
                            await stop.wait()
                    pause = min(pause * 2, 2.0)
                    continue
                async with engine:
                    # The readiness line: registered, listening, claiming (tests wait for it).
                    print(f"worker {engine.worker_id} on {args.db}", flush=True)
                    await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        asyncio.run(serve())
    except StoreError as exc:
        print(f"timebound worker: {exc}", file=sys.stderr)
        return 1
    return 0
