"""``timebound check``: the worst-case time check of a Constellation program, a module of
Python policies, a pipeline plan or a workflow definition (docs/check.md, D14).

A Constellation program is type-checked first, as before (its diagnostics, and ``--modules``
to check module calls). Exit codes: 0 no error-level finding; 1 an error (a compile error or a
time contradiction); 2 input that cannot be read (a missing file, one of an unknown kind, a
module that does not import, a document the engine refuses).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import ConfigurationError, InvalidInput, to_seconds
from ..analysis import KINDS, Report, check_time

__all__ = ["register"]

_SEVERITIES = ("error", "warning", "info")


def register(subparsers: Any) -> None:
    """Add the ``check`` command."""
    check = subparsers.add_parser(
        "check",
        help="check a Constellation program, policies, a pipeline plan or a workflow",
        description="Check the worst-case time of a Constellation program (.cst), the "
        "resilient policies of a Python module (.py or --kind policy MODULE), a pipeline plan "
        "or a workflow definition (JSON/YAML): retries that can never start, inner bounds that "
        "the bounds around them always cut, fallbacks with no time left, computed defaults. "
        "A .cst program is type-checked first.",
    )
    check.add_argument(
        "file", metavar="FILE", help="the input (or a module name with --kind policy)"
    )
    check.add_argument(
        "--kind", choices=KINDS, help="what FILE is, when its name and content do not say"
    )
    check.add_argument(
        "--budget",
        metavar="DURATION",
        help="the caller's budget the checked thing runs under, e.g. 2s (a run's --timeout, a "
        "request's deadline)",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--modules",
        metavar="MODULE[:NAME]",
        help="for a .cst program: the Python module defining the ModuleRegistry, to type-check "
        "module calls",
    )
    check.set_defaults(handler=_check)


def _fail(message: str) -> int:
    print(f"timebound check: {message}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> int:
    budget = None
    if args.budget is not None:
        try:
            budget = to_seconds(args.budget, option="--budget", allow_zero=False)
        except ConfigurationError as exc:
            return _fail(f"{exc}; a budget is a positive duration such as 2s")
    kind = args.kind
    if kind is None and args.file.endswith(".cst"):
        kind = "constellation"
    if args.modules and kind not in (None, "constellation"):
        return _fail("--modules applies to Constellation programs (.cst) only")
    compiled: dict[str, Any] | None = None
    if kind == "constellation":
        from . import _dsl

        code, compiled = _dsl.check_program(args, quiet=args.json)
        if code == 2 or compiled is None:
            return code
        if compiled["parsed"] is False:
            if args.json:
                doc = {"kind": "constellation", "source": args.file, "ok": False}
                print(json.dumps({**doc, **_compiled_json(compiled)}, indent=2))
            return code
    try:
        report = check_time(args.file, kind=kind, budget=budget)
    except ModuleNotFoundError as exc:
        # The engine of this kind needs an extra (pipeline: pyarrow; workflow: jsonschema).
        return _fail(
            f"needs an extra that is not installed ({exc.name}): pip install "
            "'timebound[pipeline,workflow]'"
        )
    except InvalidInput as exc:
        return _fail(str(exc))
    except RecursionError:
        return _fail(f"{args.file}: nested too deeply to check")
    failed = not report.ok or (compiled is not None and compiled["compile_errors"] > 0)
    if args.json:
        doc = report.to_json()
        if compiled is not None:
            doc["ok"] = not failed
            doc.update(_compiled_json(compiled))
        print(json.dumps(doc, ensure_ascii=False, indent=2))
        return 1 if failed else 0
    for finding in report.findings:
        print(finding)
    if compiled is not None:
        print(compiled["summary"] if report.ok else f"{args.file}: {_counts(report)}")
    else:
        print(f"{args.file}: {'ok' if report.ok else 'failed'} ({_counts(report)})")
    return 1 if failed else 0


def _compiled_json(compiled: dict[str, Any]) -> dict[str, Any]:
    """A program's compile result in the JSON report: its diagnostics and their error count."""
    return {
        "compile_errors": compiled["compile_errors"],
        "diagnostics": compiled["diagnostics"],
    }


def _counts(report: Report) -> str:
    n = {s: sum(1 for f in report.findings if f.severity == s) for s in _SEVERITIES}
    words = (
        _plural(n["error"], "error"),
        _plural(n["warning"], "warning"),
        _plural(n["info"], "note"),
    )
    return "worst-case time: " + ", ".join(words)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")
