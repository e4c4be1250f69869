"""``timebound run`` and ``timebound check``: Constellation programs from the command line.

Exit codes (docs/constellation.md): 0 success; 1 compile errors (``check``/``run``) or a failed
run; 2 bad command-line usage (unreadable file, module that cannot be imported, bad input).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from typing import Any, TextIO

from .. import ConfigurationError, to_seconds
from ..dsl import (
    BOOLEAN,
    FLOAT,
    INT,
    STRING,
    CallTrace,
    CompileError,
    Diagnostic,
    InputError,
    ListType,
    MapType,
    ModuleRegistry,
    OptionalType,
    Program,
    RecordType,
    Type,
    compile,
    format_diagnostic,
    format_failure,
    to_json_value,
)
from ..lowlevel import load_module
from ._render import call_json, call_timeline

__all__ = ["register"]


class _Usage(Exception):
    """Bad command-line usage: message printed, exit code 2."""


def register(subparsers: Any) -> None:
    """Add the ``run`` command (``check`` is ``cli/_check.py``'s, which calls
    :func:`check_program` for a program's diagnostics)."""
    run = subparsers.add_parser(
        "run",
        help="run a Constellation program",
        description="Compile and run a Constellation program (.cst) against Python modules "
        "(a program calling only the standard library needs none). An input not given takes "
        "its @example value.",
    )
    _common(run, modules_required=False)
    run.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an input; VALUE is converted by the input's declared type (JSON for records, "
        "lists, maps and optionals)",
    )
    run.add_argument("--inputs-json", metavar="FILE", help="all inputs as one JSON object")
    run.add_argument("--timeout", metavar="DURATION", help="deadline for the whole run, e.g. 2s")
    run.add_argument(
        "--concurrency", type=int, metavar="N", help="run at most N calls at once (by priority)"
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print the outputs as JSON (a failed run: a JSON error object)",
    )
    run.add_argument("--trace", action="store_true", help="print a timeline of the calls")
    run.set_defaults(handler=_run)


def _common(p: argparse.ArgumentParser, *, modules_required: bool = True) -> None:
    p.add_argument("file", metavar="FILE.cst", help="the program")
    p.add_argument(
        "--modules",
        required=modules_required,
        metavar="MODULE[:NAME]",
        help="the Python module defining the ModuleRegistry: a module name (shop, pkg.shop) "
        "or a file (shop.py, ./lib/shop.py); NAME picks one of several registries",
    )


# Loading -----------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        # utf-8-sig: a byte order mark (Windows editors) is dropped, not read as a character.
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise _Usage(f"cannot read {path}: {exc}") from None


def _import(mod_name: str) -> Any:
    """Import ``mod_name``, a dotted module name or the path of a ``.py`` file."""
    try:
        return load_module(mod_name, what="--modules")
    except ConfigurationError as exc:
        raise _Usage(str(exc)) from None


def _registry(spec: str) -> ModuleRegistry:
    # "C:\\x\\shop.py" has a drive colon; NAME never contains a path separator or a dot.
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not attr.isidentifier():
        mod_name, attr = spec, ""
    module = _import(mod_name)
    if attr:
        reg = getattr(module, attr, None)
        if not isinstance(reg, ModuleRegistry):
            raise _Usage(f"{mod_name}:{attr} is not a ModuleRegistry")
        return reg
    found = {n: v for n, v in vars(module).items() if isinstance(v, ModuleRegistry)}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise _Usage(f"module {mod_name!r} defines no ModuleRegistry at module level")
    names = ", ".join(f"{mod_name}:{n}" for n in sorted(found))
    raise _Usage(f"module {mod_name!r} defines several registries; pick one of {names}")


def _compile(
    args: argparse.Namespace, out: TextIO, *, checking: bool = False
) -> tuple[Program | None, str, list[Diagnostic]]:
    """The program (None when it does not compile), its source and its diagnostics.

    Without ``--modules`` the program has the standard library only. ``check`` then treats a
    call of any other module as unknown (E009), whose result type is unknown and checked no
    further: those diagnostics are dropped and everything else is reported.
    """
    source = _read(args.file)
    registry = _registry(args.modules) if args.modules else ModuleRegistry()
    try:
        program = compile(source, modules=registry)
    except CompileError as exc:
        lenient = checking and not args.modules
        diagnostics = [d for d in exc.diagnostics if not lenient or d.code != "E009"]
        for d in diagnostics:
            print(format_diagnostic(d, source, args.file), file=out)
        return None, source, diagnostics
    return program, source, program.warnings


# check --------------------------------------------------------------------------------------


def check_program(args: argparse.Namespace, *, quiet: bool) -> tuple[int, dict[str, Any] | None]:
    """Type-check the program ``args.file`` (``args.modules``: its registry) for ``check``.

    Prints its diagnostics unless ``quiet``; returns the exit code so far (2: unusable input,
    then ``None``) and what the report adds: ``parsed`` (whether the time check can go on),
    ``compile_errors``, ``diagnostics`` and the ``summary`` line.
    """
    out = open(os.devnull, "w") if quiet else sys.stdout  # noqa: SIM115 - closed below
    try:
        try:
            program, source, diagnostics = _compile(args, out, checking=True)
        except _Usage as exc:
            print(f"timebound check: {exc}", file=sys.stderr)
            return 2, None
        errors = sum(1 for d in diagnostics if d.severity == "error")
        info: dict[str, Any] = {
            "parsed": errors == 0,
            "compile_errors": errors,
            "diagnostics": [_diagnostic_json(d) for d in diagnostics],
        }
        if program is None:
            if errors:
                return 1, info
            # Only unknown modules stood in the way: syntax and everything checkable are fine.
            info["summary"] = (
                f"{args.file}: ok without modules ({len(diagnostics)} warnings; module calls "
                f"not checked: add --modules MODULE to check them)"
            )
            return 0, info
        for d in program.warnings:
            print(format_diagnostic(d, source, args.file), file=out)
        info["summary"] = (
            f"{args.file}: ok ({len(program.inputs)} inputs, {len(program.outputs)} outputs, "
            f"{len(program.warnings)} warnings)"
        )
        return 0, info
    finally:
        if out is not sys.stdout:
            out.close()


def _diagnostic_json(d: Diagnostic) -> dict[str, Any]:
    return {
        "code": d.code,
        "severity": d.severity,
        "message": d.message,
        "line": d.line,
        "column": d.column,
    }


# run ----------------------------------------------------------------------------------------


# The literal forms of the language (Python's int()/float() also take "1_000", " 5", "nan",
# other scripts' digits): what --input accepts for Int and Float.
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _convert(name: str, text: str, t: Type) -> Any:
    try:
        if t == STRING:
            return text
        if t in (INT, FLOAT):
            if (_INT_RE if t == INT else _FLOAT_RE).fullmatch(text) is None:
                raise ValueError("not a number literal")
            return int(text) if t == INT else float(text)
        if t == BOOLEAN:
            if text in ("true", "false"):
                return text == "true"
            raise ValueError("expected true or false")
        return _from_json(json.loads(text), t)
    except (ValueError, RecursionError) as exc:
        raise _Usage(f"--input {name}: cannot read {text!r} as {t}: {exc}") from None


def _from_json(value: Any, t: Type) -> Any:
    """``value`` as decoded from JSON, with the keys of maps whose key type is Int read as Int
    (JSON object keys are always strings). Anything else is left to input validation."""
    if isinstance(t, OptionalType):
        return _from_json(value, t.inner)
    if isinstance(t, ListType) and isinstance(value, list):
        return [_from_json(v, t.elem) for v in value]
    if isinstance(t, RecordType) and isinstance(value, dict):
        fields = t.field_map()
        return {k: _from_json(v, fields[k]) if k in fields else v for k, v in value.items()}
    if isinstance(t, MapType) and isinstance(value, dict):
        int_keys = t.key == INT
        return {
            (int(k) if int_keys and _INT_RE.fullmatch(k) else k): _from_json(v, t.value)
            for k, v in value.items()
        }
    return value


def _inputs(args: argparse.Namespace, program: Program) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if args.inputs_json:
        try:
            data = json.loads(_read(args.inputs_json))
        except (ValueError, RecursionError) as exc:
            raise _Usage(f"--inputs-json {args.inputs_json}: invalid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise _Usage(f"--inputs-json {args.inputs_json}: expected a JSON object")
        for name, value in data.items():
            t = program.inputs.get(name)
            values[name] = value if t is None else _from_json(value, t)
    for item in args.input:
        name, sep, text = item.partition("=")
        if not sep:
            raise _Usage(f"--input {item!r}: expected NAME=VALUE")
        if name not in program.inputs:
            known = ", ".join(program.inputs) or "none"
            raise _Usage(f"--input {name}: the program has no input '{name}' (inputs: {known})")
        values[name] = _convert(name, text, program.inputs[name])
    for name, value in program.examples.items():  # `@example(...)` stands in for a missing input
        values.setdefault(name, value)
    return values


def _run(args: argparse.Namespace) -> int:
    try:
        program, source, _ = _compile(args, sys.stderr)
        if program is None:
            return 1
        for d in program.warnings:
            print(format_diagnostic(d, source, args.file), file=sys.stderr)
        inputs = _inputs(args, program)
        timeout = None
        if args.timeout is not None:
            try:
                timeout = to_seconds(args.timeout, option="--timeout", allow_zero=False)
            except ConfigurationError as exc:
                raise _Usage(f"{exc}; a run's timeout is a positive duration such as 2s") from None
        if args.concurrency is not None and args.concurrency < 1:
            raise _Usage("--concurrency must be >= 1")
    except _Usage as exc:
        print(f"timebound run: {exc}", file=sys.stderr)
        return 2
    trace: list[CallTrace] = []
    try:
        if args.trace:
            result = asyncio.run(
                program.run_traced(
                    inputs, timeout=timeout, concurrency=args.concurrency, sink=trace
                )
            )
            raw = result.outputs
        else:
            raw = asyncio.run(program.run(inputs, timeout=timeout, concurrency=args.concurrency))
    except InputError as exc:
        print(f"timebound run: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        breakdown = getattr(exc, "breakdown", None) if args.trace else None
        if args.json:
            failure: dict[str, Any] = {"error": _error_json(exc, args.file)}
            if args.trace:
                failure["trace"] = [call_json(t) for t in trace]
                if breakdown is not None:
                    failure["breakdown"] = breakdown.to_dict()  # D13.7
            print(json.dumps(failure, ensure_ascii=False, indent=2))
            return 1
        if args.trace:
            call_timeline(trace, None, sys.stderr)
            if breakdown is not None:
                # D13.7: where the run's budget went, the tree under the one-line summary.
                print(f"\nwhere the budget went:\n{breakdown.render()}", file=sys.stderr)
        _print_failure(exc, source, args.file)
        return 1
    outputs = to_json_value(raw)
    if args.json:
        doc: Any = outputs
        if args.trace:
            doc = {"outputs": outputs, "trace": [call_json(t) for t in trace]}
        print(json.dumps(doc, ensure_ascii=False, indent=2))
        return 0
    for name, value in outputs.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        print(f"{name} = {shown}")
    if args.trace:
        print()
        call_timeline(trace, None, sys.stdout)
    return 0


def _message(exc: BaseException) -> str:
    """The error's message without the ``[at line L, column C: M]`` suffix the runtime adds:
    the CLI shows the call site as ``FILE:LINE:COL`` instead."""
    site = getattr(exc, "call_site", None)
    return str(exc).replace(f" [at {site}]", "") if site is not None else str(exc)


def _error_json(exc: BaseException, filename: str) -> dict[str, Any]:
    site = getattr(exc, "call_site", None)
    return {
        "type": type(exc).__name__,
        "code": getattr(exc, "code", None),
        "message": _message(exc),
        "file": filename,
        "call_site": None
        if site is None
        else {"module": site.module, "line": site.line, "column": site.column},
    }


def _print_failure(exc: BaseException, source: str, filename: str) -> None:
    print(format_failure(exc, source, filename), file=sys.stderr)
