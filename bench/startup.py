"""Startup benchmarks: what `import timebound`, its first use and the `timebound` command cost a
new process, against the imports of the peers a user would reach for instead.

Run: ``python bench/startup.py --out bench/results/startup.json`` (about a minute per repeat;
``--quick`` for a shorter run). Prints a table; writes the results only with ``--out``. Each
command is a fresh interpreter, timed from spawn to exit, hyperfine-style: warm-up runs first,
then rounds that run every command once in turn (so a busy phase of the machine hits all of them
alike); the median per command is compared with the median of a baseline measured in the same
rounds:

- ``python -c pass`` for ``import timebound`` and the command line;
- the first ``fail_after`` (importing timebound and entering one scope) against ``import
  asyncio``, the cheapest way to get a deadline without timebound;
- the first ``resilient`` call (decorating and calling one function) against the cheapest of
  ``import tenacity``, ``import stamina`` and ``import backoff``, each measured in the same rounds.

Every command runs with every module's bytecode cached, as in an installed package (pip compiles
it at install): the environment's ``PYTHONDONTWRITEBYTECODE`` is dropped and ``PYTHONPYCACHEPREFIX``
points at a directory of this run, which the warm-up runs fill and which is removed at the end.
Otherwise a checkout's sources, under a shell that forbids writing bytecode, are compiled again in
every process while the peers' installed modules load from their cache.

``python -X importtime -c "import timebound; timebound.fail_after(1)"`` shows where the time goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import MS, Row, now, pick, run_bench

PY = sys.executable
# The console script pip installs next to the interpreter, as users run it (`python -m
# timebound` would add runpy's own imports).
SCRIPT = str(Path(PY).with_name("timebound"))
PASS = "python -c pass"
PEERS = ("startup.import_tenacity", "startup.import_stamina", "startup.import_backoff")

FIRST_FAIL_AFTER = "import timebound as tb\nwith tb.fail_after(1):\n    pass"
FIRST_RESILIENT = (
    "import timebound as tb\n@tb.resilient(retry=3)\ndef f():\n    return 1\nassert f() == 1"
)
ARGPARSE_HELP = (
    "import re, argparse\np = argparse.ArgumentParser(prog='floor')\n"
    "p.add_argument('--version', action='version', version='floor 1')\np.parse_args(['--help'])"
)

# (metric, command, baseline metric or None, target ratio or None)
COMMANDS: list[tuple[str, list[str], str | None, float | None]] = [
    ("startup.python_pass", [PY, "-c", "pass"], None, None),
    # The root package loads its names on first use: importing it costs almost nothing.
    ("startup.import_timebound", [PY, "-c", "import timebound"], "startup.python_pass", 1.3),
    ("startup.import_asyncio", [PY, "-c", "import asyncio"], "startup.python_pass", None),
    ("startup.import_tenacity", [PY, "-c", "import tenacity"], "startup.python_pass", None),
    ("startup.import_stamina", [PY, "-c", "import stamina"], "startup.python_pass", None),
    ("startup.import_backoff", [PY, "-c", "import backoff"], "startup.python_pass", None),
    # The first deadline: against asyncio's import (asyncio.timeout needs nothing more).
    ("startup.first_fail_after", [PY, "-c", FIRST_FAIL_AFTER], "startup.import_asyncio", 1.5),
    # The first retry policy: against the cheapest retry library's import.
    ("startup.first_resilient", [PY, "-c", FIRST_RESILIENT], "cheapest peer", 1.5),
    # The floor of any console script with an argparse CLI: pip's script imports re, then
    # argparse (with enum, gettext, locale, ...). A reference row.
    ("startup.argparse_floor", [PY, "-c", "import re, argparse"], "startup.python_pass", None),
    # The floor of any argparse --help: a parser with one option printing its help (argparse
    # formats it with textwrap and translates it through gettext, which imports locale).
    ("startup.argparse_help_floor", [PY, "-c", ARGPARSE_HELP], "startup.python_pass", None),
    # --help and --version import no command: argparse is most of what remains.
    ("startup.cli_help", [SCRIPT, "--help"], "startup.python_pass", 2.0),
    ("startup.cli_version", [SCRIPT, "--version"], "startup.python_pass", 2.0),
    # A command imports its own module only: `run --help` loads the Constellation language.
    ("startup.cli_run_help", [SCRIPT, "run", "--help"], "startup.python_pass", None),
]


def _once(command: list[str], env: dict[str, str]) -> float:
    start = now()
    subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
    )
    return now() - start


def measure(args: argparse.Namespace) -> list[Row]:
    cache = tempfile.mkdtemp(prefix="timebound-startup-pyc-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    try:
        return _measure(args, env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _measure(args: argparse.Namespace, env: dict[str, str]) -> list[Row]:
    warmup, rounds = pick(args, (5, 40), (2, 10), (1, 2))
    for _ in range(warmup):
        for _metric, command, _base, _target in COMMANDS:
            _once(command, env)
    samples: dict[str, list[float]] = {metric: [] for metric, *_ in COMMANDS}
    for _ in range(rounds):
        for metric, command, _base, _target in COMMANDS:
            samples[metric].append(_once(command, env))
    medians = {metric: statistics.median(values) for metric, values in samples.items()}
    cheapest = min(PEERS, key=lambda m: medians[m])
    rows = []
    for metric, _command, base_metric, target in COMMANDS:
        value = medians[metric]
        if base_metric is None:
            rows.append(Row(metric, value * MS, "ms"))
            continue
        if base_metric == "cheapest peer":
            name, base = "the cheapest of import tenacity/stamina/backoff", medians[cheapest]
        else:
            name = PASS if base_metric == "startup.python_pass" else base_metric.split(".")[1]
            base = medians[base_metric]
        rows.append(
            Row(
                metric,
                value * MS,
                "ms",
                baseline=name.replace("_", " "),
                baseline_value=base * MS,
                target=None if target is None else f"<= {target}x",
                passed=None if target is None else value <= target * base,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(run_bench("startup", __doc__, measure))
