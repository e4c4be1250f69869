"""Modules shared by the Constellation tests: each records when it ran, on timebound's clock."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Optional, TypedDict

from timebound._core import _clock
from timebound.dsl import ModuleRegistry, Program, compile


class User(TypedDict):
    id: str
    name: str
    score: int


@dataclass
class Log:
    """What ran: (module, argument, start, end) in call order."""

    calls: list[tuple[str, object, float, float | None]] = field(default_factory=list)

    def start(self, name: str, arg: object) -> int:
        self.calls.append((name, arg, _clock.now(), None))
        return len(self.calls) - 1

    def end(self, i: int) -> None:
        name, arg, start, _ = self.calls[i]
        self.calls[i] = (name, arg, start, _clock.now())

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def starts(self, name: str) -> list[float]:
        return [c[2] for c in self.calls if c[0] == name]


_unique = itertools.count()


def unique(prefix: str) -> str:
    """A module name no other test uses (caches, throttles and slots are shared per name)."""
    return f"{prefix}{next(_unique)}"


def make_registry(log: Log | None = None) -> ModuleRegistry:
    """Echo, Inc, Slow, Hang, Fail, Greet, GetUser, Maybe... (see the bodies)."""
    log = log if log is not None else Log()
    r = ModuleRegistry()

    @r.module
    def Echo(x: int) -> int:
        i = log.start("Echo", x)
        log.end(i)
        return x

    @r.module
    async def Inc(x: int) -> int:
        i = log.start("Inc", x)
        await asyncio.sleep(1)
        log.end(i)
        return x + 1

    @r.module
    async def Slow(seconds: int) -> int:
        i = log.start("Slow", seconds)
        await asyncio.sleep(seconds)
        log.end(i)
        return seconds

    @r.module
    async def Hang(x: int) -> int:
        log.start("Hang", x)
        await asyncio.sleep(10**9)
        return x

    @r.module
    async def Fail(x: int) -> int:
        i = log.start("Fail", x)
        await asyncio.sleep(1)
        log.end(i)
        raise ValueError(f"Fail({x}) always fails")

    @r.module
    def Greet(name: str) -> str:
        log.start("Greet", name)
        return f"hello {name}"

    @r.module
    async def GetUser(user_id: str) -> User:
        i = log.start("GetUser", user_id)
        await asyncio.sleep(1)
        log.end(i)
        return {"id": user_id, "name": "Ada", "score": 17}

    @r.module
    def Maybe(x: int) -> Optional[int]:  # noqa: UP045 - the Optional spelling is under test
        return None if x < 0 else x

    @r.module
    def Words(text: str) -> list[str]:
        return text.split()

    @r.module
    def Counts(words: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in words:
            out[w] = out.get(w, 0) + 1
        return out

    @r.module(name="text.upper")
    def upper(text: str) -> str:
        return text.upper()

    r.log = log  # type: ignore[attr-defined]
    return r


def build(source: str, registry: ModuleRegistry | None = None) -> Program:
    """Compile ``source`` against ``registry`` (default: a fresh :func:`make_registry`)."""
    return compile(source, modules=registry if registry is not None else make_registry())
