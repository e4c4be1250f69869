"""Shared helpers for timebound's benchmarks: timing, result rows, repeats, the table, the file.

Every benchmark measures timebound and its baseline *in the same process, in the same run*, and
reports a ratio, so the numbers compare like with like on whatever machine runs them
(CONVENTIONS: timing targets live in benchmarks, never in unit tests). Peers' reference rows
(tenacity, stamina, backoff, asyncio.timeout, DBOS, ...) are measured in the same run too, never
carried over as constants.

Every script runs through :func:`run_bench`, which gives them one command line:

- ``--help`` prints the script's description and options and exits: nothing runs;
- ``--quick`` a shorter run (fewer samples, same rows), ``--smoke`` a seconds-long run of the same
  code paths for the test suite (its figures mean nothing);
- ``--repeats N`` runs the whole measurement N times (3 by default, 1 with ``--quick`` and
  ``--smoke``); each row reports the median over repeats with its min and max, and passes only
  when its worst repeat passes;
- ``--out PATH`` writes the results there; without it nothing is written (the table is printed);
- SIGTERM and SIGINT end a run as an error does (:func:`signals_unwind`): every ``finally`` runs,
  so the servers and workers a script started are stopped and the schemas it made dropped.

The results file records the machine: CPU count, the load average before and after, Python.

Typical use::

    from _common import Row, interleave, run_bench

    def measure(args) -> list[Row]:
        times = interleave({"base": run_base, "mine": run_mine}, rounds=9, n=1000)
        return [Row("x.overhead", times["mine"] - times["base"], "us", ...)]

    if __name__ == "__main__":
        run_bench("core", __doc__, measure)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
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
    """Seconds per call: ``run()`` times ``n`` calls and returns elapsed seconds; best of ``batches``.

    Each batch starts from a collected heap, with the collector off while it runs. Collecting only
    once before all the batches let the garbage cycles of a code that makes them (tenacity and
    stamina make 18 and 38 per call) pile up uncollected over thousands of calls, so each call
    allocated fresh memory instead of reusing freed blocks: their overhead read about twice what
    short batches show. Keep ``n`` small for such code (a few hundred calls).
    """
    best = math.inf
    for _ in range(batches):
        with no_gc():
            best = min(best, run())
    return best / n


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
    #: Over repeats (set by :func:`merge_repeats`): the lowest and highest value, how many
    #: repeats measured the row, and the ratio's range.
    low: float | None = None
    high: float | None = None
    repeats: int = 1
    ratio_range: tuple[float, float] | None = field(default=None)

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
            "min": _round(self.value if self.low is None else self.low),
            "max": _round(self.value if self.high is None else self.high),
            "repeats": self.repeats,
            "ratio_range": None
            if self.ratio_range is None
            else [_round(self.ratio_range[0]), _round(self.ratio_range[1])],
        }


def _round(x: float) -> float:
    return float(f"{x:.4g}") if math.isfinite(x) else x


def print_table(rows: Iterable[Row], title: str | None = None) -> None:
    """Print rows as an aligned text table."""
    rows = list(rows)
    if title:
        print(f"\n{title}")
    header = (
        "metric", "median", "min", "max", "unit", "baseline", "base value", "ratio", "target",
        "pass",
    )  # fmt: skip
    lines = [header]
    for r in rows:
        lines.append(
            (
                r.metric,
                f"{r.value:.4g}",
                f"{r.value if r.low is None else r.low:.4g}",
                f"{r.value if r.high is None else r.high:.4g}",
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


def merge_repeats(repeats: Sequence[Sequence[Row]]) -> list[Row]:
    """One row per metric over several repeats of a measurement, in first-seen order.

    The value and baseline are medians over the repeats that measured the row; ``low``/``high``
    its range; ``passed`` is true only when every repeat passed (the worst repeat decides), false
    when any missed, ``None`` for a row without a target.
    """
    order: list[str] = []
    by_metric: dict[str, list[Row]] = {}
    for rows in repeats:
        for row in rows:
            if row.metric not in by_metric:
                order.append(row.metric)
                by_metric[row.metric] = []
            by_metric[row.metric].append(row)
    merged = []
    for metric in order:
        rows = by_metric[metric]
        values = [float(r.value) for r in rows]
        bases = [float(r.baseline_value) for r in rows if r.baseline_value is not None]
        verdicts = [r.passed for r in rows if r.passed is not None]
        ratios = [r.ratio for r in rows if r.ratio is not None]
        merged.append(
            replace(
                rows[0],
                value=statistics.median(values),
                baseline_value=statistics.median(bases) if bases else None,
                passed=all(verdicts) if verdicts else None,
                low=min(values),
                high=max(values),
                repeats=len(rows),
                ratio_range=(min(ratios), max(ratios)) if ratios else None,
            )
        )
    return merged


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPUs, the load average now, Python, the platform."""
    return {
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The shared command line (``--quick``, ``--smoke``, ``--repeats``, ``--out``).

    The description is the script's docstring, so ``--help`` says what the script measures.
    """
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    tier = p.add_mutually_exclusive_group()
    tier.add_argument("--quick", action="store_true", help="a shorter run: fewer samples")
    tier.add_argument(
        "--smoke",
        action="store_true",
        help="a seconds-long run for the tests (figures mean nothing)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="run the measurement this many times (default 3; 1 with --quick or --smoke); each "
        "row reports its median, min and max, and passes only if its worst repeat passes",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the results (JSON) to this file; without it nothing is written",
    )
    return p


def tier(args: argparse.Namespace) -> str:
    """``"smoke"``, ``"quick"`` or ``"full"``."""
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def pick(args: argparse.Namespace, full: Any, quick: Any, smoke: Any) -> Any:
    """The size for this run's tier."""
    return {"full": full, "quick": quick, "smoke": smoke}[tier(args)]


@contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGTERM and SIGINT unwind the run: raised in the main thread as ``SystemExit(143)`` and
    ``KeyboardInterrupt``, so every ``finally`` and ``with`` on the way out runs — the servers and
    workers a script started are stopped, the schemas it made dropped — where Python's default
    SIGTERM would end the process at once and leave them behind. A second signal while that
    cleanup runs gets the previous handler (the default: stop now). The previous handlers are
    restored on the way out.

    Both are raised, not left to ``asyncio.run``: its runner turns Ctrl-C into a cancellation of
    the main task and raises ``KeyboardInterrupt`` only if that task ends cancelled (one that
    finished in the same turn returned its result, and the interrupt was lost); it installs that
    handler only over Python's default one. Exit statuses: 143 (128 + SIGTERM), 130 (SIGINT).
    """
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def unwind(signum: int, frame: Any) -> None:
        for sig in signals:
            signal.signal(sig, previous[sig])
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, unwind)
    try:
        yield
    finally:
        for sig in signals:
            signal.signal(sig, previous[sig])


@contextmanager
def killed_unless_started(proc: subprocess.Popen[Any]) -> Iterator[None]:
    """Around the wait for a child process to be ready: if it ends in an error (a signal
    unwinding the run, a child that never became ready) the child is killed, since nothing
    owns it yet to stop it."""
    try:
        yield
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        raise


def run_bench(
    name: str,
    doc: str | None,
    measure: Callable[[argparse.Namespace], list[Row]],
    *,
    configure: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
    title: str | None = None,
    method: str | None = None,
) -> int:
    """Parse the command line, run ``measure(args)`` ``--repeats`` times, print, maybe write.

    ``configure`` adds a script's own options; ``method`` (text) is recorded in the results, for
    a figure whose meaning depends on how it was taken. Returns the exit status (0). ``--help``
    exits in the parser, before anything is measured.
    """
    p = parser(doc)
    if configure is not None:
        configure(p)
    args = p.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick or args.smoke else 3)
    if repeats < 1:
        p.error("--repeats must be at least 1")
    args.repeats = repeats
    started = time.perf_counter()
    before = machine()
    runs = []
    with signals_unwind():
        for i in range(repeats):
            if repeats > 1:
                print(f"-- repeat {i + 1} of {repeats}", flush=True)
            runs.append(measure(args))
    rows = merge_repeats(runs)
    after = machine()
    print_table(rows, title=title or f"{name} ({tier(args)}, {repeats} repeat(s))")
    missed = [r.metric for r in rows if r.passed is False]
    print(f"\n{len(rows)} rows, {len(missed)} missed target(s) {missed or ''}")
    print(
        f"load average {before['loadavg'][0]} at the start, {after['loadavg'][0]} at the end, "
        f"{before['cpus']} CPUs; took {time.perf_counter() - started:.0f} s"
    )
    if args.out is not None:
        path = write_results(
            args.out,
            rows,
            bench=name,
            tier=tier(args),
            repeats=repeats,
            machine={
                "cpus": before["cpus"],
                "loadavg_start": before["loadavg"],
                "loadavg_end": after["loadavg"],
                "python": before["python"],
                "platform": before["platform"],
            },
            argv=list(sys.argv[1:] if argv is None else argv),
            **({} if method is None else {"method": method}),
        )
        print(f"wrote {path}")
    return 0


def write_results(path: Path | str, rows: Iterable[Row], **meta: Any) -> Path:
    """Write ``{"bench": ..., "machine": ..., ..., "rows": [...]}`` to ``path``; return it.

    A bare name (``"core"``) means ``bench/results/core.json``. Only :func:`run_bench` calls this,
    and only when ``--out`` asked for a file.
    """
    path = Path(path)
    if path.suffix != ".json" and path.parent == Path("."):
        path = RESULTS_DIR / f"{path}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "rows": [r.as_json() for r in rows]}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
