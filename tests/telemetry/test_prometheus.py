"""Prometheus exporter with the real prometheus-client registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from timebound.policies import Policy
from timebound.telemetry import counters
from timebound.telemetry.prometheus import CountersCollector, PrometheusExporter
from timebound.testing import VirtualClock


def _flaky(failures: int) -> object:
    calls = 0

    def fn() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ConnectionError
        return "ok"

    return fn


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)  # type: ignore[no-any-return]


def test_policy_counters(virtual_clock: VirtualClock) -> None:
    """Attempts, retries, timeouts, fallbacks and cache hits are counted per policy."""
    registry = CollectorRegistry()
    with PrometheusExporter(registry):
        Policy("PromRetry", retry=2).execute_sync(_flaky(2))  # type: ignore[arg-type]
        Policy("PromFb", fallback="x").execute_sync(_flaky(1))  # type: ignore[arg-type]
        cached = Policy("PromCache", cache="1min")
        cached.execute_sync(_flaky(0))  # type: ignore[arg-type]
        cached.execute_sync(_flaky(0))  # type: ignore[arg-type]

        def late() -> None:
            virtual_clock.advance(2)

        Policy("PromTimeout", timeout=1, on_error="skip").execute_sync(late)
        text = generate_latest(registry).decode()
        assert _value(registry, "timebound_attempts_total", policy="PromRetry") == 3.0
        assert _value(registry, "timebound_retries_total", policy="PromRetry") == 2.0
        assert _value(registry, "timebound_fallbacks_total", policy="PromFb") == 1.0
        assert _value(registry, "timebound_cache_hits_total", policy="PromCache") == 1.0
        assert _value(registry, "timebound_timeouts_total", policy="PromTimeout") == 1.0
        assert 'timebound_attempts_total{policy="PromRetry"} 3.0' in text


def test_userver_counters_are_exposed_sanitized() -> None:
    """timebound.telemetry.counters appear with userver-style names sanitised for Prometheus."""
    registry = CollectorRegistry()
    registry.register(CountersCollector())
    counters.inc("prom-test-received", 2, test="prom")
    text = generate_latest(registry).decode()
    assert _value(registry, "timebound_prom_test_received_total", test="prom") == 2.0
    assert "# TYPE timebound_prom_test_received_total counter" in text


def test_mixed_label_sets_share_one_family() -> None:
    """Samples of one counter with different label names are exposed with the union, "" if unset."""
    registry = CollectorRegistry()
    registry.register(CountersCollector())
    counters.inc("prom-test-mixed", 1, component="http-server")
    counters.inc("prom-test-mixed", 4, method="GET")
    assert (
        _value(registry, "timebound_prom_test_mixed_total", component="http-server", method="")
        == 1.0
    )
    assert _value(registry, "timebound_prom_test_mixed_total", component="", method="GET") == 4.0


def test_counters_incremented_before_install_are_seen() -> None:
    """The collector reads counters at scrape time, so earlier increments count."""
    counters.inc("prom-test-early", 1, test="prom-early")
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    assert _value(registry, "timebound_prom_test_early_total", test="prom-early") == 1.0
    exporter.close()


def test_close_unregisters_everything(virtual_clock: VirtualClock) -> None:
    """After close() the registry no longer has timebound metrics and events are not counted."""
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry).install()
    exporter.close()
    Policy("PromClosed").execute_sync(_flaky(0))  # type: ignore[arg-type]
    assert "timebound_" not in generate_latest(registry).decode()
    PrometheusExporter(registry).close()  # the names can be registered again


def test_usable_as_an_observer(virtual_clock: VirtualClock) -> None:
    """An exporter can observe a single execution instead of listening globally."""
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry, include_counters=False)
    Policy("PromObserver", retry=1).execute_sync(_flaky(1), observer=exporter)  # type: ignore[arg-type]
    assert _value(registry, "timebound_attempts_total", policy="PromObserver") == 2.0
    exporter.close()
