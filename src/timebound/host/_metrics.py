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
        stops: dict[str, dict[tuple[str, str], int]],
        unrunnable: int,
    ) -> None:
        self._counts, self._timeouts, self._deferred = counts, timeouts, deferred
        self._stops, self._unrunnable = stops, unrunnable

    def collect(self) -> Any:
        for what in ("runs", "tokens"):
            family = GaugeMetricFamily(
                f"timebound_workflow_{what}", f"Workflow {what} by state", labels=["state"]
            )
            for state, n in sorted(self._counts[what].items()):
                family.add_metric([state], n)
            yield family
        yield from self._timeout_families()
        yield from self._worker_families()
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

    def _worker_families(self) -> Any:
        """Multi-process work (D6.14, D6.15): how long a stopped attempt took to stop on the
        worker that ran it, by how that worker learnt of the stop (tallied as each is recorded),
        and the ready tokens no live worker can run."""
        by_via: dict[str, dict[str, int]] = {}
        for (via, bucket), n in self._stops.get("wf_stops", {}).items():
            by_via.setdefault(via, {})[bucket] = n
        sums = {via: n for (via, _), n in self._stops.get("wf_stop_ms_sum", {}).items()}
        histogram = HistogramMetricFamily(
            "timebound_workflow_stop_seconds",
            "From the commit that stopped a token (cancel, timeout, join decision) to the end of "
            "its handler on the worker running it, by how that worker learnt of it",
            labels=["via"],
        )
        for via in sorted(by_via):
            histogram.add_metric([via], _buckets(by_via[via]), sum_value=sums.get(via, 0) / 1000)
        yield histogram
        yield GaugeMetricFamily(
            "timebound_workflow_tokens_unrunnable",
            "Ready tokens whose handler no live worker has: they wait for one, or their deadline",
            value=self._unrunnable,
        )

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
            buckets = _buckets(t.lag_buckets.get(layer, {}))
            histogram.add_metric([layer], buckets, sum_value=t.lag_sum_ms.get(layer, 0) / 1000)
        yield histogram


def _buckets(by_bucket: dict[str, int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets, in seconds, from counts by stored bucket (ms)."""
    buckets: list[tuple[str, float]] = []
    seen = 0
    for ms in LAG_BUCKETS_MS:
        seen += by_bucket.get(str(ms), 0)
        buckets.append((repr(ms / 1000), seen))
    buckets.append(("+Inf", seen + by_bucket.get("inf", 0)))
    return buckets


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
            await engine.stop_tallies(),
            len(await engine.unrunnable()),
        )
        registry = CollectorRegistry()
        registry.register(snapshot)
        registry.register(CountersCollector())
        body: bytes = generate_latest(registry) + generate_latest(self._host.registry)
        return body
