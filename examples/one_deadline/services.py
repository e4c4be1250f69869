"""The three services of the showcase, as ASGI apps served by uvicorn on 127.0.0.1.

- ``storefront``: reads the caller's deadline header (``DeadlineMiddleware``) and runs the
  Constellation program ``program.cst`` under it.
- ``inventory``: the second service the ``Stock`` module calls over httpx through timebound's
  transport; it answers from its SQLite store.
- ``render``: answers ``202`` with a deferred operation (``timebound.deferred``) and finishes the
  work in the background; the workflow's node calls it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import ranking
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from timeline import Timeline

import timebound as tb
from timebound.deferred import Registry, Service, status_app
from timebound.dsl import ModuleRegistry, compile
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport

HERE = Path(__file__).parent


def _ms() -> str:
    return f"{tb.remaining() * 1000:.0f} ms"


def storefront(tl: Timeline, inventory_url: str) -> tuple[Any, httpx.AsyncClient]:
    """The storefront app, and the httpx client it uses to reach the inventory service."""
    client = httpx.AsyncClient(
        transport=AsyncDeadlineTransport(), base_url=inventory_url, timeout=5
    )
    modules = ModuleRegistry()

    @modules.module
    async def Rank(user_id: str) -> list[int]:
        tl.say(
            "pipeline", f"Rank({user_id!r}) starts, sees {_ms()} (min of 250 ms and the request)"
        )
        top, wrapper = await ranking.rank()
        tl.bound(
            "pipeline",
            f"timeout_wrapper region ({wrapper['timeout_ms']} ms)",
            fired=bool(wrapper["timed_out"]),
        )
        tl.say("pipeline", f"chosen_branch={wrapper['chosen_branch']!r}")
        tl.say("pipeline", f"ranked {top} (popularity order: personal features were dropped)")
        return [int(i) for i in top]

    @modules.module
    async def Stock(user_id: str) -> int:
        tl.say("http", f"Stock({user_id!r}) calls the inventory service, {_ms()} left")
        answer = await client.get(f"/stock/{user_id}")
        answer.raise_for_status()
        return int(answer.json()["items"])

    program = compile((HERE / "program.cst").read_text(), modules=modules)

    async def recommendations(request: Request) -> JSONResponse:
        user = request.path_params["user"]
        tl.say("storefront", f"request for {user!r} arrives with {_ms()} left (deadline header)")
        result = await program.run_traced({"userId": user})
        for call in result.trace:
            tl.say(
                "dsl",
                f"call {call.node} ({call.module}): outcome={call.outcome}, "
                f"attempts={call.attempts}",
            )
            tl.bound("dsl", f"{call.module} call timeout", fired=call.timeouts > 0)
        tl.say("storefront", f"answers 200 with {_ms()} still left")
        return JSONResponse(result.outputs)

    app = Starlette(routes=[Route("/recommendations/{user}", recommendations)])
    return DeadlineMiddleware(app), client


def create_store(path: Path) -> None:
    """The inventory service's SQLite store."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS stock (user_id TEXT PRIMARY KEY, items INTEGER)")
        db.execute("INSERT OR REPLACE INTO stock VALUES ('ada', 42)")


def inventory(tl: Timeline, store: Path) -> Any:
    """The inventory app: one query against SQLite, under the propagated deadline."""

    def query(user: str) -> int:
        with sqlite3.connect(store) as db:
            row = db.execute("SELECT items FROM stock WHERE user_id = ?", (user,)).fetchone()
        return int(row[0]) if row else 0

    async def stock(request: Request) -> JSONResponse:
        user = request.path_params["user"]
        tl.say("inventory", f"GET /stock/{user} arrives with {_ms()} left (propagated header)")
        # The query runs in a thread; the request's deadline (set by the middleware from the
        # header) bounds the wait for it, as it bounds everything this handler awaits.
        items = await asyncio.to_thread(query, user)
        tl.say("inventory", f"SQLite answered items={items}, {_ms()} left")
        tl.bound("inventory", "propagated HTTP deadline", fired=tb.remaining() <= 0)
        return JSONResponse({"items": items})

    return DeadlineMiddleware(Starlette(routes=[Route("/stock/{user}", stock)]))


def render(tl: Timeline, served: Registry) -> Any:
    """The render service: a deferred operation that takes 300 ms of background work."""
    service = Service(served)

    @service.operation("report.render", retry_after=1, ttl=60)
    async def render_report(payload: dict[str, Any]) -> dict[str, Any]:
        tl.say("render", "background work starts (the caller already has its 202)")
        await asyncio.sleep(0.3)
        tl.say("render", "background work done")
        return {"pages": payload["pages"]}

    return status_app(served, service)
