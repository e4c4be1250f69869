"""Small fakes shared by the policy tests: calls that fail N times, hang, or record instants."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from timebound._core import _clock
from timebound.telemetry import Event


class Flaky:
    """Fails its first ``failures`` calls, then returns ``value``; records when it was called."""

    def __init__(self, failures: int, value: Any = "ok", error: type[Exception] = ConnectionError):
        self.failures = failures
        self.value = value
        self.error = error
        self.calls: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(_clock.now())
        if len(self.calls) <= self.failures:
            raise self.error(f"failure {len(self.calls)}")
        return self.value


class AsyncFlaky(Flaky):
    """The async twin of :class:`Flaky`."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return Flaky.__call__(self, *args, **kwargs)


class Hang:
    """An async call that never answers on its own; records when each attempt started."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(_clock.now())
        await asyncio.sleep(10**9)


class SlowSync:
    """A sync call that takes ``seconds`` of (virtual) time, then returns ``value``."""

    def __init__(self, seconds: float, value: Any = "late") -> None:
        self.seconds = seconds
        self.value = value
        self.calls: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(_clock.now())
        _clock.sleep(self.seconds)
        return self.value


class Recorder:
    """An observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def names(self) -> list[str]:
        return [e.name for e in self.events]

    def of(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]


def gaps(instants: list[float]) -> list[float]:
    """Differences between consecutive instants."""
    return [round(b - a, 9) for a, b in itertools.pairwise(instants)]
