"""The example actions the compose file's hosts and worker load (``TIMEBOUND_ACTIONS=actions``).

Replace this folder with your own: a module of handlers and a ``flows/`` folder of definitions.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def greet(ctx: Any) -> Any:
    """Answers a greeting for ``input.name`` after ``input.sleep_s`` seconds (0 by default)."""
    given = ctx.input or {}
    await asyncio.sleep(given.get("sleep_s", 0))
    return {"greeting": f"hello, {given.get('name', 'world')}"}
