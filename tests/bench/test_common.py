"""The shared benchmark harness (``bench/_common.py``): repeats merge into one row per metric,
and a row passes only when its worst repeat passes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def common() -> Iterator[object]:
    sys.path.insert(0, str(BENCH))
    try:
        import _common

        yield _common
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("_common", None)


def test_median_min_max_over_repeats(common: object) -> None:
    Row = common.Row  # type: ignore[attr-defined]
    runs = [
        [Row("x", v, "us", "base", b, "<= 2x", v <= 2 * b)] for v, b in ((1, 1), (3, 2), (2, 2))
    ]
    (row,) = common.merge_repeats(runs)  # type: ignore[attr-defined]
    assert (row.value, row.low, row.high, row.repeats) == (2, 1, 3, 3)
    assert row.baseline_value == 2
    assert row.passed is True
    assert row.ratio_range == (1.0, 1.5)


def test_a_row_passes_only_when_its_worst_repeat_passes(common: object) -> None:
    Row = common.Row  # type: ignore[attr-defined]
    runs = [[Row("x", v, "ms", target="<= 10", passed=v <= 10)] for v in (5, 11, 6)]
    (row,) = common.merge_repeats(runs)  # type: ignore[attr-defined]
    assert row.value == 6  # the median passes...
    assert row.passed is False  # ...but one repeat missed


def test_rows_without_a_target_stay_without_a_verdict(common: object) -> None:
    Row = common.Row  # type: ignore[attr-defined]
    runs = [[Row("a", 1, "s"), Row("b", 2, "s")], [Row("b", 4, "s")]]
    a, b = common.merge_repeats(runs)  # type: ignore[attr-defined]
    assert a.passed is None and a.repeats == 1
    assert (b.value, b.repeats) == (3, 2)
