"""Modules for ``user_profile.cst``: a cache that is too slow, a database, a scorer."""

from __future__ import annotations

import asyncio
from typing import TypedDict

from timebound.dsl import ModuleRegistry

registry = ModuleRegistry()


class User(TypedDict):
    id: str
    name: str
    score: int


@registry.module
async def GetUserFromCache(user_id: str) -> User:
    """A cache that has gone slow: the 100 ms timeout cuts it and the fallback takes over."""
    await asyncio.sleep(5)
    return {"id": user_id, "name": "cached", "score": 0}


@registry.module
async def GetUserFromDB(user_id: str) -> User:
    """The source of truth: 30 ms."""
    await asyncio.sleep(0.03)
    return {"id": user_id, "name": "Ada", "score": 17}


@registry.module
def Score(user: User) -> int:
    """A pure function of the record."""
    return user["score"]


@registry.module(name="text.upper")
def upper(text: str) -> str:
    """A qualified module name, called as text.upper(...)."""
    return text.upper()
