"""``/metrics``: what the store holds, at a cost that does not grow with its history (D8.12).

Timeouts by layer and their detection lag come from the store's tallies (bumped as each timeout
commits, by whichever process noticed it); runs, tokens and deferred operations by state are
counted off the event loop. Scrapes that arrive while one is being read share it, so any number
of scrapers cost one read at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ..telemetry.prometheus import CountersCollector
from ..workflow._metrics import LAG_BUCKETS_MS, LAYERS, TimeoutTallies

__all__ = ["Metrics"]


class _Snapshot(Collector):
    """What the store holds, read once per scrape: runs and tokens by state, every timeout by
    layer with its detection lag, and deferred operations by state with their polls. Read from
    the store, not counted in this process, so the numbers include other workers' work."""

    def __init__(
        self,
        counts: dict[str, dict[str, int]],
        timeouts: TimeoutTallies,
        deferred: tuple[dict[tuple[str, str], int], dict[str, int]],
    ) -> None:
        self._counts, self._timeouts, self._deferred = counts, timeouts, deferred

    def collect(self) -> Any:
        for what in ("runs", "tokens"):
            family = GaugeMetricFamily(
                f"timebound_workflow_{what}", f"Workflow {what} by state", labels=["state"]
            )
            for state, n in sorted(self._counts[what].items()):
                family.add_metric([state], n)
            yield family
        yield from self._timeout_families()
        ops, polls = self._deferred
        family = GaugeMetricFamily(
            "timebound_deferred_operations",
            "Deferred operations by state and module",
            labels=["state", "module"],
        )
        for (state, module), n in sorted(ops.items()):
            family.add_metric([state, module], n)
        yield family
        counter = CounterMetricFamily(
            "timebound_deferred_polls",
            "Polls made of deferred operations, by module",
            labels=["module"],
        )
        for module, n in sorted(polls.items()):
            counter.add_metric([module], n)
        yield counter

    def _timeout_families(self) -> Any:
        t = self._timeouts
        counter = CounterMetricFamily(
            "timebound_workflow_timeouts",
            "Timeouts by layer (workflow, node, synchronization) and the policy applied",
            labels=["layer", "policy"],
        )
        for (layer, policy), n in sorted(t.counts.items()):
            counter.add_metric([layer, policy], n)
        yield counter
        histogram = HistogramMetricFamily(
            "timebound_workflow_timeout_detection_lag_seconds",
            "From a timeout's deadline to the instant the engine acted on it, by layer",
            labels=["layer"],
        )
        for layer in sorted({*LAYERS.values(), *t.lag_buckets}):
            by_bucket = t.lag_buckets.get(layer, {})
            buckets, seen = [], 0
            for ms in LAG_BUCKETS_MS:
                seen += by_bucket.get(str(ms), 0)
                buckets.append((repr(ms / 1000), seen))
            buckets.append(("+Inf", seen + by_bucket.get("inf", 0)))
            histogram.add_metric([layer], buckets, sum_value=t.lag_sum_ms.get(layer, 0) / 1000)
        yield histogram


class Metrics:
    """One host's ``/metrics`` body. Concurrent scrapes share the read in flight (D8.12)."""

    def __init__(self, host: Any) -> None:
        self._host = host
        self._pending: asyncio.Future[bytes] | None = None

    async def scrape(self) -> bytes:
        pending = self._pending
        if pending is None:
            pending = self._pending = asyncio.ensure_future(self._read())
            pending.add_done_callback(self._done)
        # shield: one scraper hanging up must not cancel the read the others wait for.
        return await asyncio.shield(pending)

    def _done(self, future: asyncio.Future[bytes]) -> None:
        if self._pending is future:
            self._pending = None
        if not future.cancelled():
            future.exception()  # retrieved: a failed read is reported to its waiters only

    async def _read(self) -> bytes:
        engine = self._host.engine
        snapshot = _Snapshot(
            await engine.counts(),
            await engine.timeout_tallies(),
            await engine.deferred_registry.stats(),
        )
        registry = CollectorRegistry()
        registry.register(snapshot)
        registry.register(CountersCollector())
        body: bytes = generate_latest(registry) + generate_latest(self._host.registry)
        return body
