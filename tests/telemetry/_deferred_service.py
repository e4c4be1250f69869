"""A deferred-operation service in a process of its own, for the end-to-end trace test.

Run as ``python -m uvicorn tests.telemetry._deferred_service:app``; the store is the SQLite file
named by ``TB_SERVICE_DB``. Its one operation, ``report.render``, finishes after 0.2 s.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from timebound.deferred import HostPolicy, Registry, Service, status_app

registry = Registry(f"sqlite:///{os.environ['TB_SERVICE_DB']}", policy=HostPolicy())
service = Service(registry, max_running=3)


@service.operation("report.render", retry_after=1, ttl=120)
async def render(payload: Any) -> Any:
    await asyncio.sleep(0.2)
    return {"pages": payload["pages"]}


_app = status_app(registry, service)


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        message = await receive()
        await registry.open()
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        assert message["type"] == "lifespan.shutdown"
        await registry.close()
        await send({"type": "lifespan.shutdown.complete"})
        return
    await _app(scope, receive, send)
