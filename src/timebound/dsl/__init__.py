"""The Constellation language: typed dataflow programs whose module calls carry resilience
options (``with timeout: 2s, retry: 3, fallback: ...``), compiled to a DAG and run concurrently on
timebound's policies and deadlines.

>>> from timebound.dsl import ModuleRegistry, compile
>>> registry = ModuleRegistry()
>>> @registry.module
... def Greet(name: str) -> str:
...     return f"hello {name}"
>>> program = compile('in who: String\\ngreeting = Greet(who)\\nout greeting', modules=registry)
>>> program.run_sync({"who": "ada"})
{'greeting': 'hello ada'}
"""

from __future__ import annotations

from ._diagnostics import CODES, CompileError, Diagnostic, format_diagnostic, format_failure
from ._ir import CallNode, CallOptions, ProgramIR
from ._registry import ModuleRegistry, ModuleSpec
from ._runtime import (
    Annotation,
    AttemptTrace,
    CallSite,
    CallTrace,
    InputError,
    Program,
    TracedRun,
    to_json_value,
)
from ._types import BOOLEAN, FLOAT, INT, STRING, ListType, MapType, OptionalType, RecordType, Type

__all__ = [
    "BOOLEAN",
    "CODES",
    "FLOAT",
    "INT",
    "STRING",
    "Annotation",
    "AttemptTrace",
    "CallNode",
    "CallOptions",
    "CallSite",
    "CallTrace",
    "CompileError",
    "Diagnostic",
    "InputError",
    "ListType",
    "MapType",
    "ModuleRegistry",
    "ModuleSpec",
    "OptionalType",
    "Program",
    "ProgramIR",
    "RecordType",
    "TracedRun",
    "Type",
    "compile",
    "format_diagnostic",
    "format_failure",
    "to_json_value",
]


def compile(source: str, *, modules: ModuleRegistry | None = None) -> Program:
    """Parse and type-check ``source`` against ``modules`` (and the standard library, which
    every program may call); return a runnable :class:`Program`.

    Raises :class:`CompileError` whose ``.diagnostics`` lists every error (with line and
    column); warnings of a program that compiles are in ``Program.warnings``.
    """
    from ._compiler import compile_source

    if not isinstance(source, str):
        raise TypeError(f"source must be a str, not {type(source).__name__}")
    if modules is None:
        modules = ModuleRegistry()
    elif not isinstance(modules, ModuleRegistry):
        raise TypeError(f"modules must be a ModuleRegistry, not {type(modules).__name__}")
    return compile_source(source, modules)


def __getattr__(name: str) -> object:
    # Renamed so that one name does not mean two things (workflow.RunResult is a workflow's).
    if name == "RunResult":
        import warnings

        warnings.warn(
            "timebound.dsl.RunResult is now timebound.dsl.TracedRun",
            DeprecationWarning,
            stacklevel=2,
        )
        return TracedRun
    raise AttributeError(f"module 'timebound.dsl' has no attribute {name!r}")
