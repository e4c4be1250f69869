"""Shared helpers for timebound's benchmarks: timing, result rows, the table and the JSON file.

Every benchmark measures timebound and its baseline *in the same process, in the same run*, and
reports a ratio, so the numbers compare like with like on whatever machine runs them
(CONVENTIONS: timing targets live in benchmarks, never in unit tests).

Typical use::

    from _common import Row, best_per_call, interleave, print_table, write_results

    times = interleave({"base": run_base, "mine": run_mine}, rounds=9)   # seconds per call
    rows = [Row.make("x.overhead", times["mine"] - times["base"], "us", ...)]
    print_table(rows)
    write_results("core", rows)
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Multipliers from seconds to the units rows use.
US = 1e6
MS = 1e3


@contextmanager
def no_gc() -> Iterator[None]:
    """Disable the cyclic garbage collector for a timing loop (a collection is noise, not cost)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def best_per_call(run: Callable[[], float], n: int, batches: int = 3) -> float:
    """Seconds per call: ``run()`` times ``n`` calls and returns elapsed seconds; best of ``batches``."""
    with no_gc():
        return min(run() for _ in range(batches)) / n


def interleave(
    runs: dict[str, Callable[[], float]], *, rounds: int, n: int, batches: int = 3
) -> dict[str, float]:
    """Per-call seconds for each variant: round-robin ``rounds`` times, median of best-of-batches.

    Interleaving makes slow phases of the machine (another process, frequency changes) hit every
    variant alike; best-of-batches drops one-off hiccups; the median over rounds decides.
    """
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(best_per_call(run, n, batches))
    return {name: statistics.median(values) for name, values in samples.items()}


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of ``values``, nearest-rank on the sorted data."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[rank]


def now() -> float:
    """The benchmark stopwatch (``time.perf_counter``)."""
    return time.perf_counter()


@dataclass
class Row:
    """One result row. ``ratio`` is ``value / baseline_value``; ``target``/``pass`` are optional.

    ``target`` is a human-readable rule (``"<= 1.0x asyncio.timeout"``); ``passed`` is whether the
    measured numbers meet it (``None`` for reference rows without a target).
    """

    metric: str
    value: float
    unit: str
    baseline: str | None = None
    baseline_value: float | None = None
    target: str | None = None
    passed: bool | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline_value is None or self.baseline_value == 0:
            return None
        return self.value / self.baseline_value

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": _round(self.value),
            "unit": self.unit,
            "baseline": self.baseline,
            "baseline_value": None if self.baseline_value is None else _round(self.baseline_value),
            "ratio": None if self.ratio is None else _round(self.ratio),
            "target": self.target,
            "pass": self.passed,
        }


def _round(x: float) -> float:
    return float(f"{x:.4g}") if math.isfinite(x) else x


def print_table(rows: Iterable[Row], title: str | None = None) -> None:
    """Print rows as an aligned text table."""
    rows = list(rows)
    if title:
        print(f"\n{title}")
    header = ("metric", "value", "unit", "baseline", "base value", "ratio", "target", "pass")
    lines = [header]
    for r in rows:
        lines.append(
            (
                r.metric,
                f"{r.value:.4g}",
                r.unit,
                r.baseline or "",
                "" if r.baseline_value is None else f"{r.baseline_value:.4g}",
                "" if r.ratio is None else f"{r.ratio:.3g}",
                r.target or "",
                {True: "ok", False: "MISS", None: ""}[r.passed],
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def write_results(name: str, rows: Iterable[Row]) -> Path:
    """Write ``bench/results/<name>.json``: a JSON list of row objects. Returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps([r.as_json() for r in rows], indent=2) + "\n")
    return path
