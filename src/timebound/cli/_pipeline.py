"""``timebound pipeline compile|validate|run``: ranking pipelines from the command line.

Plans come from a Python module (``MODULE:NAME``, a ``pl.Plan`` or a function returning one);
artifacts from JSON files (then ``--catalog MODULE:NAME`` names the tasks to validate and run
against); rows from Parquet, CSV or JSON (newline-delimited) files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from timebound import ConfigurationError, format_duration
from timebound import pipeline as pl
from timebound.lowlevel import load_module

from ._render import span_timeline

__all__ = ["register"]


class _Usage(Exception):
    """A command-line mistake: printed as one line, exit status 2."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pipeline",
        help="compile, validate and run pipelines",
        description="Compile plans to artifacts, validate them, run them on rows.",
    )
    sub = parser.add_subparsers(dest="pipeline_command", metavar="ACTION", required=True)

    compile_ = sub.add_parser("compile", help="compile a plan to an artifact (JSON)")
    compile_.add_argument("plan", metavar="MODULE:NAME", help="the plan (a pl.Plan or a function)")
    compile_.add_argument("-o", "--output", metavar="FILE", help="write here, not to stdout")
    compile_.set_defaults(handler=_guard(_compile_cmd))

    validate = sub.add_parser("validate", help="validate a plan or an artifact")
    _source_args(validate)
    validate.set_defaults(handler=_guard(_validate_cmd))

    run = sub.add_parser("run", help="run a plan or an artifact on rows")
    _source_args(run)
    run.add_argument("--rows", required=True, metavar="FILE", help=".parquet, .csv or .json")
    run.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a request param (VALUE is JSON, or else a string); repeatable",
    )
    run.add_argument("--json", action="store_true", help="print rows and trace as JSON")
    run.set_defaults(handler=_guard(_run_cmd))


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="MODULE:NAME|ARTIFACT.json", help="a plan or an artifact")
    p.add_argument(
        "--catalog",
        "--registry",  # its old name, still accepted
        dest="catalog",
        metavar="MODULE:NAME",
        help="the pl.Catalog of keys, params and tasks (needed with an artifact)",
    )
    p.add_argument("--env", choices=["prod", "dev"], default="prod", help="engine env (D5.6)")
    p.add_argument(
        "--capability",
        action="append",
        metavar="ID",
        help="enable only these capabilities (repeatable; default: all supported)",
    )


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except _Usage as exc:
            print(f"timebound pipeline: {exc}", file=sys.stderr)
            return 2
        except pl.ValidationError as exc:
            print(_describe(exc), file=sys.stderr)
            return 1
        except (pl.TaskError, pl.PlanTimeout) as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1

    return handler


def _describe(exc: pl.ValidationError) -> str:
    span = exc.source_span
    where = f"{span['file']}:{span['line']}: " if span else ""
    node = f" node {exc.node_id}:" if exc.node_id else ""
    text = f"{where}error: [{exc.rule}]{node} {exc.message}"
    if exc.details:
        text += f"\n  details: {json.dumps(exc.details, sort_keys=True)}"
    return text


# Loading ----------------------------------------------------------------------------------


def _attr(spec: str, what: str) -> Any:
    """``MODULE:NAME`` with MODULE a dotted name or a ``.py`` path."""
    mod_name, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        raise _Usage(f"{what} {spec!r}: write MODULE:NAME, e.g. ranking:plan or ./ranking.py:plan")
    try:
        module = load_module(mod_name, what=what)
    except ConfigurationError as exc:
        raise _Usage(str(exc)) from None
    if not hasattr(module, name):
        raise _Usage(f"module {mod_name!r} has no {name!r}")
    return getattr(module, name)


def _plan(spec: str) -> pl.Plan:
    value = _attr(spec, "plan")
    if callable(value) and not isinstance(value, pl.Plan):
        value = value()
    if not isinstance(value, pl.Plan):
        raise _Usage(f"{spec} is not a pl.Plan (nor a function returning one)")
    return value


def _source(args: argparse.Namespace) -> tuple[pl.Artifact, pl.Catalog]:
    """The artifact to use and the catalog to validate and run it against."""
    source: str = args.source
    if source.endswith(".json"):
        if not args.catalog:
            raise _Usage("an artifact needs --catalog MODULE:NAME (the tasks to run it with)")
        try:
            data = pathlib.Path(source).read_bytes()
        except OSError as exc:
            raise _Usage(f"cannot read {source}: {exc.strerror}") from None
        artifact = pl.Artifact.from_json(data)
    else:
        plan = _plan(source)
        artifact = pl.compile(plan)
        if not args.catalog:
            return artifact, plan.catalog
    catalog = _attr(args.catalog, "catalog")
    if not isinstance(catalog, pl.Catalog):
        raise _Usage(f"{args.catalog} is not a pl.Catalog")
    return artifact, catalog


def _engine(args: argparse.Namespace, registry: pl.Catalog) -> pl.Engine:
    return pl.Engine(registry, env=args.env, capabilities=args.capability)


def _rows(path: str, registry: pl.Catalog) -> pa.Table:
    suffix = pathlib.Path(path).suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        elif suffix == ".csv":
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(path)
        elif suffix in (".json", ".jsonl", ".ndjson"):
            import pyarrow.json as pjson

            table = pjson.read_json(path)
        else:
            raise _Usage(f"--rows {path}: give a .parquet, .csv or .json file")
    except (OSError, pa.ArrowInvalid) as exc:
        raise _Usage(f"cannot read rows from {path}: {exc}") from None
    # Text formats guess types (every number a double or int64): cast to the keys' types
    # where the values allow it; the engine reports what still does not fit.
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        kdef = registry.keys.get(name)
        if kdef is not None and column.type != kdef.type:
            try:
                column = column.cast(kdef.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        columns[name] = column
    return pa.table(columns)


def _params(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise _Usage(f"--param {pair!r}: write NAME=VALUE")
        try:
            out[name] = json.loads(text)
        except ValueError:
            out[name] = text
    return out


# Commands ---------------------------------------------------------------------------------


def _compile_cmd(args: argparse.Namespace) -> int:
    artifact = pl.compile(_plan(args.plan))
    data = artifact.to_json()
    if args.output:
        pathlib.Path(args.output).write_bytes(data)
        print(f"{args.output}: {artifact.digest}", file=sys.stderr)
    else:
        sys.stdout.write(data.decode("utf-8") + "\n")
    return 0


def _validate_cmd(args: argparse.Namespace) -> int:
    artifact, registry = _source(args)
    _engine(args, registry).prepare(artifact)
    print(f"ok {artifact.plan['name']} {artifact.digest}")
    return 0


def _run_cmd(args: argparse.Namespace) -> int:
    artifact, registry = _source(args)
    engine = _engine(args, registry)
    rows = _rows(args.rows, registry)
    result = asyncio.run(engine.run(artifact, rows, request_params=_params(args.param)))
    if args.json:
        out = {"rows": result.rows.to_pylist(), "trace": result.trace.to_dict()}
        print(json.dumps(out, sort_keys=True, default=str))
        return 0
    print(_table(result.rows))
    for node_id, w in result.trace.wrappers.items():
        fields = ", ".join(f"{k}={v}" for k, v in w.items())
        print(f"wrapper {node_id}: {fields}")
    path = result.trace.critical_path()
    print("critical path: " + " -> ".join(f"{s['node_id']} ({_ms(s)})" for s in path))
    print()
    span_timeline(result.trace.spans, sys.stdout)
    return 0


def _ms(span: dict[str, Any]) -> str:
    return format_duration((span["end_ms"] - span["start_ms"]) / 1000)


def _table(rows: pa.Table) -> str:
    """Rows as aligned text columns (header first)."""
    names = rows.column_names
    cells = [names] + [[_cell(r[n]) for n in names] for r in rows.to_pylist()]
    widths = [max(len(row[i]) for row in cells) for i in range(len(names))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )


def _cell(value: Any) -> str:
    return "null" if value is None else str(value)
