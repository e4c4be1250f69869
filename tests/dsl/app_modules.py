"""The application modules upstream's example programs call, written for timebound: same names,
parameters and behaviour (delays, failures), so the programs run as their comments describe.

``make_registry()`` builds a fresh registry each time: the flaky services count their calls per
registry, never across tests. Given a Redis URL it also registers the ``"redis"`` cache backend
two of the programs name (a real Redis server, keys under a prefix of their own). ``registry`` is
one registry for the command line (``timebound run prog.cst --modules
tests/dsl/app_modules.py``). ``bench/dsl_corpus.py`` runs upstream's example programs with them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from timebound.dsl import ModuleRegistry

__all__ = ["RedisCache", "make_registry", "registry"]


class RedisCache:
    """A cache backend on a Redis server: values stored as JSON (so a hit is always a fresh
    object) under ``prefix``, expiring after their TTL on the server's clock."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=2)
        self.prefix = prefix

    def get(self, key: str) -> tuple[bool, Any]:
        raw = self.client.get(self.prefix + key)
        return (False, None) if raw is None else (True, json.loads(raw))

    def set(self, key: str, value: Any, ttl: float) -> None:
        self.client.set(self.prefix + key, json.dumps(value), px=max(1, round(ttl * 1000)))

    def clear(self) -> None:
        """Delete this cache's keys (and close the connection)."""
        keys = list(self.client.scan_iter(match=self.prefix + "*"))
        if keys:
            self.client.delete(*keys)
        self.client.close()


def make_registry(redis_cache: RedisCache | None = None) -> ModuleRegistry:
    r = ModuleRegistry()
    if redis_cache is not None:
        r.register_cache_backend("redis", redis_cache)
    flaky_calls = itertools.count(1)
    timeout_calls = itertools.count(1)

    # Text ------------------------------------------------------------------------------------

    @r.module
    def Uppercase(text: str) -> str:
        return text.upper()

    @r.module
    def Lowercase(text: str) -> str:
        return text.lower()

    @r.module
    def Trim(text: str) -> str:
        return text.strip()

    @r.module
    def WordCount(text: str) -> int:
        return len(text.split())

    @r.module
    def TextLength(text: str) -> int:
        return len(text)

    @r.module
    def Contains(text: str, substring: str) -> bool:
        return substring in text

    @r.module
    def SplitLines(text: str) -> list[str]:
        return text.split("\n")

    # Data ------------------------------------------------------------------------------------

    @r.module
    def SumList(numbers: list[int]) -> int:
        return sum(numbers)

    @r.module
    def Average(numbers: list[int]) -> float:
        return sum(numbers) / len(numbers) if numbers else 0.0

    @r.module
    def Max(numbers: list[int]) -> int:
        return max(numbers, default=0)

    @r.module
    def Min(numbers: list[int]) -> int:
        return min(numbers, default=0)

    @r.module
    def FilterGreaterThan(numbers: list[int], threshold: int) -> list[int]:
        return [n for n in numbers if n > threshold]

    @r.module
    def MultiplyEach(numbers: list[int], multiplier: int) -> list[int]:
        return [n * multiplier for n in numbers]

    @r.module
    def FormatNumber(number: int) -> str:
        return f"{number:,}"

    # Services with delays and failures ---------------------------------------------------------

    @r.module
    async def SlowQuery(query: str) -> str:
        await asyncio.sleep(0.5)
        return f"Result for: {query}"

    @r.module
    async def SlowApiCall(endpoint: str) -> str:
        await asyncio.sleep(1)
        return f"API response from: {endpoint}"

    @r.module
    async def ExpensiveCompute(data: str) -> str:
        await asyncio.sleep(2)
        return f"Computed: {data.upper()}"

    @r.module
    async def FlakyService(request: str) -> str:
        attempt = next(flaky_calls)
        if attempt % 3 != 0:  # fails two calls out of three
            raise ConnectionError(f"Service temporarily unavailable (attempt {attempt})")
        return f"Success for: {request}"

    @r.module
    async def TimeoutProneService(request: str) -> str:
        await asyncio.sleep(3 if next(timeout_calls) == 1 else 0.1)  # slow the first time only
        return f"Response for: {request}"

    @r.module
    async def RateLimitedApi(request: str) -> str:
        await asyncio.sleep(0.05)
        return f"Rate-limited response for: {request}"

    @r.module
    async def ResourceIntensiveTask(task: str) -> str:
        await asyncio.sleep(0.2)
        return f"Completed: {task}"

    @r.module
    async def QuickCheck(data: str) -> str:
        await asyncio.sleep(0.01)
        return "needs-deep-analysis" if "complex" in data.lower() else "valid"

    @r.module
    async def DeepAnalysis(data: str) -> str:
        await asyncio.sleep(1.5)
        return f"Deep analysis of: {data}"

    @r.module
    async def AlwaysFailsService(request: str) -> str:
        raise RuntimeError(f"Service failed for: {request}")

    return r


registry = make_registry()
