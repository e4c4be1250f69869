"""One deadline across everything: the timebound showcase.

    python examples/one_deadline/showcase.py [--keep]      (or: timebound demo --showcase)

Everything runs on this machine: three uvicorn services on 127.0.0.1, SQLite stores, no other
server. A request with a 300 ms deadline enters the storefront, whose handler runs a Constellation
program (program.cst). Its ``Rank`` module runs a ranking pipeline (ranking.py) whose
``timeout_wrapper`` region runs out and falls back; its ``Stock`` module calls the inventory
service over httpx (timebound's transport carries the remaining budget in a header) and the
inventory service queries its SQLite store. Meanwhile a durable workflow (flow.py) calls the render
service, which answers with a deferred operation: the workflow's token is suspended, then resumed
when the operation completes. Every part writes to one timeline (timeline.py), printed live.

``--keep`` then serves the workflow store with the timebound host (``timebound serve``) on
http://127.0.0.1:8080/ so its UI shows the same runs; Ctrl-C (or SIGTERM) stops it and removes
the stores.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).parent))

import flow
import httpx
import services
import uvicorn
from timeline import Timeline

import timebound as tb
from timebound.deferred import Registry
from timebound.propagation.httpx import AsyncDeadlineTransport
from timebound.telemetry import Event, add_listener

REQUEST_DEADLINE_S = 0.3


async def _serve(stack: AsyncExitStack, app: Any) -> str:
    """Serve ``app`` on a free loopback port until ``stack`` closes; returns its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def stop() -> None:
        server.should_exit = True
        await task
        sock.close()

    stack.push_async_callback(stop)
    while not server.started:
        if task.done():
            task.result()  # a start that failed raises here
        await asyncio.sleep(0.01)
    return f"http://127.0.0.1:{port}"


def _policy_lines(tl: Timeline) -> Any:
    """Policy events (attempts, timeouts, fallbacks) of the program's calls, on the timeline."""

    def listener(event: Event) -> None:
        attrs = event.attrs
        if event.name == "attempt.end" and attrs.get("outcome") != "ok":
            tl.say(
                "policy",
                f"{attrs.get('policy')}: attempt {attrs.get('attempt')} -> {attrs.get('outcome')}",
            )
        elif event.name == "fallback":
            tl.say("policy", f"{attrs.get('policy')}: fallback used ({attrs.get('reason')})")

    return add_listener(listener)


async def run(
    workdir: Path, out: TextIO | None = sys.stdout, deadline_s: float = REQUEST_DEADLINE_S
) -> dict[str, Any]:
    """Run the showcase once; returns the timeline and what the request and workflow returned."""
    tl = Timeline(out)
    services.create_store(workdir / "inventory.db")
    async with AsyncExitStack() as stack:
        stack.callback(_policy_lines(tl))
        served = await stack.enter_async_context(Registry(f"sqlite:///{workdir}/render.db"))
        inventory_url = await _serve(stack, services.inventory(tl, workdir / "inventory.db"))
        render_url = await _serve(stack, services.render(tl, served))
        storefront_app, store_client = services.storefront(tl, inventory_url)
        stack.push_async_callback(store_client.aclose)
        storefront_url = await _serve(stack, storefront_app)
        engine, flow_client = flow.engine(tl, f"sqlite:///{workdir}/runs.db", render_url)
        stack.push_async_callback(flow_client.aclose)
        await stack.enter_async_context(engine)
        client = httpx.AsyncClient(transport=AsyncDeadlineTransport(), timeout=5)
        stack.push_async_callback(client.aclose)

        if out is not None:
            print("== One deadline across everything (offsets from the request's start)", file=out)
        tl.begin()
        run_id = await engine.start("report", {})
        tl.say("workflow", f"run {run_id[:8]} of 'report' started (run timeout 20 s)")
        tl.say("client", f"GET /recommendations/ada with a {deadline_s * 1000:.0f} ms deadline")
        response: Any = None
        try:
            async with tb.fail_after(deadline_s):
                answer = await client.get(f"{storefront_url}/recommendations/ada")
                response = answer.json() if answer.status_code == 200 else answer.text
                tl.say(
                    "client",
                    f"{answer.status_code} {response}, {tb.remaining() * 1000:.0f} ms to spare",
                )
        except tb.DeadlineExceeded as exc:
            tl.say("client", f"DeadlineExceeded(source={exc.source!r})")
        tl.bound(
            "client",
            f"request deadline ({deadline_s * 1000:.0f} ms)",
            fired=response is None or answer.status_code == 498,
        )
        result = await engine.wait(run_id, timeout=15)
        tl.say("workflow", f"run {result.status}: {result.output}")
        # A node timeout ends its token as timed_out (the run may then fail); a run timeout ends
        # the run as timed_out (D6.5): either one is a workflow bound that fired.
        kinds = {event.get("kind") for event in await engine.events(run_id)}
        timed_out = result.status == "timed_out" or "token_timed_out" in kinds
        tl.bound("workflow", "workflow node and run timeouts", fired=timed_out)
    if out is not None:
        fired = [name for name, f in tl.bounds.items() if f]
        met = [name for name, f in tl.bounds.items() if not f]
        print(f"\nFired: {', '.join(fired) or 'none'}.\nMet:   {', '.join(met)}.", file=out)
    return {
        "timeline": tl,
        "response": response,
        "workflow": {"id": run_id, "status": result.status, "output": result.output},
    }


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="then serve the runs with the host UI")
    parser.add_argument("--port", type=int, default=8080, help="the host's port with --keep")
    parser.add_argument(
        "--deadline-ms",
        type=int,
        default=int(REQUEST_DEADLINE_S * 1000),
        help="the request's deadline (on a loaded machine 300 ms may not be enough)",
    )
    args = parser.parse_args(argv)
    if args.deadline_ms <= 0:
        parser.error(
            f"--deadline-ms must be a positive number of milliseconds, got {args.deadline_ms}"
        )
    if not args.keep:
        with tempfile.TemporaryDirectory(prefix="timebound-showcase-") as tmp:
            asyncio.run(run(Path(tmp), out, args.deadline_ms / 1000))
        return 0
    # --keep: the stores outlive the showcase and the host serves them, until SIGINT or SIGTERM
    # stops it; then the directory is removed like the one above.
    try:
        with tempfile.TemporaryDirectory(prefix="timebound-showcase-") as tmp, _stop_on_signals():
            return _keep(Path(tmp), out, args)
    except _Stopped:
        return 0


class _Stopped(Exception):
    """SIGINT or SIGTERM asked the --keep host to stop (after its graceful shutdown)."""


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``_Stopped`` while the block runs, so the stores' directory is
    removed on either. The host (uvicorn) takes both signals over while it serves, shuts down
    gracefully, puts these handlers back and re-raises the signal into them; without them
    SIGTERM would end the process before any cleanup. The previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: nothing to take over
        return

    def stop(signum: int, frame: Any) -> None:
        raise _Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _keep(workdir: Path, out: TextIO, args: argparse.Namespace) -> int:
    asyncio.run(run(workdir, out, args.deadline_ms / 1000))
    from timebound.cli import main as cli_main

    print(
        f"\nServing the same runs with the host (store {workdir}/runs.db): open /ui/ at the "
        "address below; Ctrl-C stops it and removes the store.",
        file=out,
        flush=True,
    )
    return cli_main(["serve", "--db", f"sqlite:///{workdir}/runs.db", "--port", str(args.port)])


if __name__ == "__main__":
    sys.exit(main())
