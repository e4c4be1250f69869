"""Invalid options raise ConfigurationError naming the option when the policy is built."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import timebound as tb
from timebound import ConfigurationError
from timebound.policies import Policy


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": "0s"}, "timeout"),
        ({"timeout": "1.5s"}, "timeout"),
        ({"timeout": "ten"}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"timeout": [1]}, "timeout"),
        ({"retry": -1}, "retry"),
        ({"retry": 1.5}, "retry"),
        ({"retry": True}, "retry"),
        ({"retry": "3"}, "retry"),
        ({"delay": 0}, "delay"),
        ({"delay": "0ms"}, "delay"),
        ({"delay": timedelta(0)}, "delay"),
        ({"backoff": "quadratic"}, "backoff"),
        ({"backoff": None}, "backoff"),
        ({"max_delay": 0}, "max_delay"),
        ({"max_delay": float("inf")}, "max_delay"),
        ({"delay": float("inf")}, "delay"),
        ({"jitter": float("inf")}, "jitter"),
        ({"jitter": -1}, "jitter"),
        ({"jitter": "soon"}, "jitter"),
        ({"cache": 0}, "cache"),
        ({"cache": -5}, "cache"),
        ({"cache_backend": "no-such-backend"}, "cache_backend"),
        ({"cache_backend": object()}, "cache_backend"),
        ({"on_error": "ignore"}, "on_error"),
        ({"throttle": "ten per second"}, "throttle"),
        ({"throttle": "0/1s"}, "throttle"),
        ({"throttle": "5/0s"}, "throttle"),
        ({"throttle": "5/"}, "throttle"),
        ({"throttle": "-1/1s"}, "throttle"),
        ({"throttle": 5}, "throttle"),
        ({"throttle": (1.5, 1)}, "throttle"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -2}, "concurrency"),
        ({"concurrency": 1.0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"total_timeout": 0}, "total_timeout"),
        ({"total_timeout": "-1s"}, "total_timeout"),
        ({"fallback_on": (ValueError,)}, "fallback_on"),
        ({"fallback": 1, "fallback_on": ()}, "fallback_on"),
        ({"fallback": 1, "fallback_on": ("ValueError",)}, "fallback_on"),
        ({"fallback": 1, "fallback_on": (asyncio.CancelledError,)}, "fallback_on"),
        ({"fallback": 1, "fallback_on": KeyboardInterrupt}, "fallback_on"),
    ],
)
def test_bad_option_is_named(options: dict[str, Any], option: str) -> None:
    """Each invalid option raises ConfigurationError (a ValueError) naming that option."""
    with pytest.raises(ConfigurationError) as info:
        Policy("op", **options)
    assert info.value.option == option
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["", None, 3])
def test_bad_name(name: Any) -> None:
    """A policy needs a non-empty string name."""
    with pytest.raises(ConfigurationError) as info:
        Policy(name)
    assert info.value.option == "name"


def test_decorator_validates_when_built() -> None:
    """resilient(...) with a bad option fails at once, before any function is wrapped."""
    with pytest.raises(ConfigurationError) as info:
        tb.resilient(timeout=0)
    assert info.value.option == "timeout"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(2, 2.0), (0.25, 0.25), ("250ms", 0.25), ("2min", 120.0), (timedelta(seconds=3), 3.0)],
)
def test_durations_accept_every_form(value: Any, seconds: float) -> None:
    """Durations accept seconds, timedelta and Constellation strings."""
    policy = Policy("op", timeout=value, delay=value, cache=value, total_timeout=value)
    assert (policy.timeout, policy.delay, policy.cache, policy.total_timeout) == (seconds,) * 4


def test_throttle_forms() -> None:
    """throttle accepts 'N/duration' (spaces around '/' allowed) and (N, duration)."""
    assert Policy("op", throttle="10/1s").throttle == (10, 1.0)
    assert Policy("op", throttle="100 / 1min").throttle == (100, 60.0)
    assert Policy("op", throttle=(3, "500ms")).throttle == (3, 0.5)


def test_infinite_timeout_is_accepted() -> None:
    """math.inf means no bound."""
    assert Policy("op", timeout=float("inf")).timeout == float("inf")
