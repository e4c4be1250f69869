"""Modules for ``resilience_tour.cst``: four services that misbehave in four ways.

Each runs on the real clock for a few hundred milliseconds, so the whole tour takes about a
second. The misbehaviour is deterministic (counters, not randomness): every run tells the same
story.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from timebound.dsl import ModuleRegistry

registry = ModuleRegistry()


@dataclass
class Quote:
    """A record type: the program passes a record, the function receives this dataclass."""

    sku: str
    stock: int
    price: float
    currency: str


_inventory_calls = itertools.count(1)
_pricing_calls = itertools.count(1)


@registry.module
async def Inventory(sku: str) -> int:
    """Flaky: of every three attempts, the first two fail with a connection error."""
    await asyncio.sleep(0.15)
    if next(_inventory_calls) % 3 != 0:
        raise ConnectionError("inventory service: connection reset")
    return 42


@registry.module
async def Pricing(sku: str) -> float:
    """Slow: every other attempt hangs (a timeout must cut it); the others take 150 ms."""
    if next(_pricing_calls) % 2 == 1:
        await asyncio.sleep(3600)
    await asyncio.sleep(0.15)
    return 18.0


@registry.module
async def Recommendations(sku: str) -> list[str]:
    """Broken: always fails after 200 ms."""
    await asyncio.sleep(0.2)
    raise RuntimeError("recommendation model not loaded")


@registry.module
async def ExchangeRate(currency: str) -> float:
    """Expensive: 250 ms per lookup (a cache hit takes none)."""
    await asyncio.sleep(0.25)
    return {"EUR": 1.0, "USD": 1.25, "GBP": 0.75}.get(currency, 1.0)


@registry.module
async def Reserve(quote: Quote) -> str:
    """Reserve the stock for a quote: 150 ms."""
    await asyncio.sleep(0.15)
    return f"reserved {quote.stock} x {quote.sku}"
