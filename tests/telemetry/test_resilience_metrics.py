"""Hedging and refused retries are counted per policy by the exporters (D3.11, D3.12, D3.14)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from timebound._core import _clock
from timebound.policies import Hedge, Policy, RetryBudget
from timebound.telemetry.prometheus import PrometheusExporter
from timebound.testing import VirtualClock


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)  # type: ignore[no-any-return]


def test_hedges_and_refused_retries_are_counted(virtual_clock: VirtualClock) -> None:
    """One hedge sent and won; one retry refused by a spent budget."""
    starts: list[float] = []

    async def slow_first() -> int:
        starts.append(_clock.now())
        await asyncio.sleep(1.0 if len(starts) == 1 else 0.01)
        return len(starts)

    def down() -> None:
        raise ConnectionError("down")

    registry = CollectorRegistry()
    with PrometheusExporter(registry):
        hedged = Policy("PromHedge", hedge=Hedge("20ms", max_extra_load=1))
        virtual_clock.run(hedged.execute(slow_first))
        budgeted = Policy(
            "PromBudget",
            retry=2,
            on_error="skip",
            retry_budget=RetryBudget(0.0, min_per_second=0),
        )
        budgeted.execute_sync(down)
        assert _value(registry, "timebound_hedges_sent_total", policy="PromHedge") == 1.0
        assert _value(registry, "timebound_hedges_won_total", policy="PromHedge") == 1.0
        assert _value(registry, "timebound_retries_refused_total", policy="PromBudget") == 1.0
