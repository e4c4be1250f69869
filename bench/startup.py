"""Startup benchmarks: what `import timebound` and the `timebound` command cost a new process.

Run: ``python bench/startup.py`` (about a minute; ``--quick`` for a smoke run). Prints a table and
writes ``bench/results/startup.json``. Each command is a fresh interpreter, timed from spawn to
exit, hyperfine-style: warm-up runs first, then rounds that run every command once in turn (so a
busy phase of the machine hits all of them alike); the median per command is compared with the
median of ``python -c pass`` measured in the same rounds.

``python -X importtime -c "import timebound"`` shows where the rest of the time goes.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

from _common import MS, Row, now, print_table, write_results

QUICK = "--quick" in sys.argv
WARMUP = 2 if QUICK else 5
ROUNDS = 5 if QUICK else 40

PY = sys.executable
# The console script pip installs next to the interpreter, as users run it (`python -m
# timebound` would add runpy's own imports).
SCRIPT = str(Path(PY).with_name("timebound"))
BASELINE = "python -c pass"

# (metric, command, target as a ratio to `python -c pass`, or None for a reference row)
COMMANDS: list[tuple[str, list[str], float | None]] = [
    ("startup.python_pass", [PY, "-c", "pass"], None),
    # The root package loads its names on first use: importing it costs almost nothing.
    ("startup.import_timebound", [PY, "-c", "import timebound"], 1.3),
    # Touching the deadline API loads the core (asyncio is most of it): a reference figure.
    ("startup.import_timebound_core", [PY, "-c", "import timebound; timebound.fail_after"], None),
    # The floor of any console script with an argparse CLI: pip's script imports re, then
    # argparse (with enum, gettext, locale, ...). A reference row.
    ("startup.argparse_floor", [PY, "-c", "import re, argparse"], None),
    # --help and --version import no command: argparse is most of what remains.
    ("startup.cli_help", [SCRIPT, "--help"], 2.0),
    ("startup.cli_version", [SCRIPT, "--version"], 2.0),
    # A command imports its own module only: `run --help` loads the Constellation language.
    ("startup.cli_run_help", [SCRIPT, "run", "--help"], None),
]


def _once(command: list[str]) -> float:
    start = now()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return now() - start


def main() -> None:
    for _ in range(WARMUP):
        for _metric, command, _target in COMMANDS:
            _once(command)
    samples: dict[str, list[float]] = {metric: [] for metric, _, _ in COMMANDS}
    for _ in range(ROUNDS):
        for metric, command, _target in COMMANDS:
            samples[metric].append(_once(command))
    medians = {metric: statistics.median(values) for metric, values in samples.items()}
    base = medians["startup.python_pass"]
    rows = []
    for metric, _command, target in COMMANDS:
        value = medians[metric]
        rows.append(
            Row(
                metric,
                value * MS,
                "ms",
                baseline=BASELINE,
                baseline_value=base * MS,
                target=None if target is None else f"<= {target}x {BASELINE}",
                passed=None if target is None else value <= target * base,
            )
        )
    print_table(rows)
    if not QUICK:
        write_results("startup", rows)


if __name__ == "__main__":
    main()
