"""Compiling a Constellation program: parse, check, lower.

The parser (``_parser.py``) turns the text into a syntax tree; the check pass (``_check.py``)
turns the tree into the typed representation (``_ir.py``) and reports every diagnostic; the lower
pass (``_lower.py``) turns a representation without errors into the runnable
:class:`~timebound.dsl.Program`.
"""

from __future__ import annotations

from ._check import check_program
from ._diagnostics import CompileError, Diagnostic
from ._lower import lower_program
from ._parser import ParseFailure, parse
from ._registry import ModuleRegistry
from ._runtime import Program

__all__ = ["compile_source"]


def compile_source(source: str, registry: ModuleRegistry) -> Program:
    """The program ``source`` says, against ``registry``; :class:`CompileError` listing every
    diagnostic (errors sorted by position) when it has an error."""
    # A UTF-8 byte order mark (Windows editors write one) is not part of the program; dropping
    # it keeps line 1's columns as an editor shows them.
    source = source.removeprefix("\ufeff")
    diags: list[Diagnostic] = []
    try:
        ir = check_program(parse(source, diags), registry, diags)
        if ir is not None:
            warnings = [d for d in diags if d.severity == "warning"]
            return lower_program(ir, registry, source, warnings)
    except ParseFailure as exc:
        diags.append(exc.diag)
    except RecursionError:
        # The nesting limits (E004) normally stop a hostile program long before this.
        diags.append(Diagnostic("E004", "error", "Program nested too deeply", 1, 1))
    diags.sort(key=lambda d: (d.line, d.column, d.severity != "error"))
    raise CompileError(diags, source)
