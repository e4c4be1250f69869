"""Every admission test starts with the process-wide counters at zero."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from timebound.telemetry import counters


@pytest.fixture(autouse=True)
def _zero_counters() -> Iterator[None]:
    """Counters start at zero and are left at zero."""
    counters.reset()
    yield
    counters.reset()
