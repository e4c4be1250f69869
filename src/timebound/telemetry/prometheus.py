"""Prometheus exporter (``pip install 'timebound[prometheus]'``).

:class:`PrometheusExporter` listens to policy events and counts, labelled by ``policy``:
``timebound_attempts_total``, ``timebound_timeouts_total``, ``timebound_retries_total``,
``timebound_fallbacks_total`` and ``timebound_cache_hits_total``. It also exposes every
:data:`timebound.telemetry.counters` value (userver's metric names, D4.7, sanitised:
``deadline-received`` → ``timebound_deadline_received_total``) through a custom collector that reads
them at scrape time, so increments made before the exporter was installed are not lost.

>>> from prometheus_client import CollectorRegistry, generate_latest
>>> registry = CollectorRegistry()
>>> exporter = PrometheusExporter(registry).install()
>>> b"timebound_attempts_total" in generate_latest(registry)
True
>>> exporter.close()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter
    from prometheus_client.core import CounterMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.telemetry.prometheus needs prometheus-client: "
        "pip install 'timebound[prometheus]'"
    ) from exc

from ._events import Counters, Event, add_listener, counters
from ._policy_metrics import POLICY_COUNTERS, policy_counter_for, sanitize_metric_name

__all__ = ["CountersCollector", "PrometheusExporter"]


class CountersCollector(Collector):
    """Exposes a :class:`~timebound.telemetry.Counters` as Prometheus counters at scrape time."""

    def __init__(self, source: Counters = counters, *, namespace: str = "timebound") -> None:
        self._source = source
        self._namespace = namespace

    def collect(self) -> Iterator[CounterMetricFamily]:
        by_name: dict[str, list[tuple[dict[str, str], int]]] = {}
        for (name, label_pairs), value in self._source.snapshot().items():
            by_name.setdefault(name, []).append((dict(label_pairs), value))
        for name in sorted(by_name):
            samples = by_name[name]
            label_names = sorted({k for sample_labels, _ in samples for k in sample_labels})
            family = CounterMetricFamily(
                f"{self._namespace}_{sanitize_metric_name(name)}",
                f"timebound counter {name!r}",
                labels=label_names,
            )
            for sample_labels, value in samples:
                family.add_metric([sample_labels.get(k, "") for k in label_names], value)
            yield family


class PrometheusExporter:
    """A telemetry listener that maintains Prometheus counters on ``registry``.

    :meth:`install` registers it as a global telemetry listener; :meth:`close` removes it and
    unregisters its metrics. It is also usable directly as a policy ``observer``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "timebound",
        include_counters: bool = True,
    ) -> None:
        self.registry = REGISTRY if registry is None else registry
        self._metrics: dict[str, Counter] = {
            short: Counter(
                f"{namespace}_{short}",
                doc,
                ["policy"],
                registry=self.registry,
            )
            for short, doc in POLICY_COUNTERS
        }
        self._collector: CountersCollector | None = None
        if include_counters:
            self._collector = CountersCollector(counters, namespace=namespace)
            self.registry.register(self._collector)
        self._remove: Callable[[], None] | None = None

    def __call__(self, event: Event) -> None:
        short = policy_counter_for(event)
        if short is not None:
            self._metrics[short].labels(policy=str(event.attrs.get("policy", ""))).inc()

    def install(self) -> PrometheusExporter:
        """Listen to every telemetry event from now on; returns ``self``."""
        if self._remove is None:
            self._remove = add_listener(self)
        return self

    def close(self) -> None:
        """Stop listening and unregister every metric from the registry."""
        if self._remove is not None:
            self._remove()
            self._remove = None
        for metric in self._metrics.values():
            _unregister(self.registry, metric)
        if self._collector is not None:
            _unregister(self.registry, self._collector)
            self._collector = None

    def __enter__(self) -> PrometheusExporter:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unregister(registry: CollectorRegistry, collector: Any) -> None:
    try:
        registry.unregister(collector)
    except KeyError:
        pass
