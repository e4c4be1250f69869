"""``check_time``: one entry point for every kind of input (D14.1).

The engines are imported only for the kind being checked, so checking Python policies needs no
extra, and a pipeline plan needs ``timebound[pipeline]`` only then.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

from .._core._durations import to_seconds
from ._findings import Report
from ._input import KINDS, CheckInputError, Kind, detect, import_policies, read
from ._policies import check_module, check_policy

__all__ = ["check_constellation", "check_pipeline", "check_time", "check_workflow"]


def _budget(budget: Any) -> float | None:
    """The caller's budget as seconds: a duration (``"2s"``, seconds, a ``timedelta``)."""
    return None if budget is None else to_seconds(budget, option="budget", allow_zero=False)


def check_constellation(source: str, *, budget: Any = None, file: str = "<program>") -> Report:
    """The findings of a Constellation program's text under the run's ``budget``."""
    from ._constellation import check_constellation as check

    return check(source, budget=_budget(budget), file=file)


def check_pipeline(
    plan: Any, *, budget: Any = None, catalog: Any = None, file: str = "<plan>"
) -> Report:
    """The findings of a pipeline plan (a ``pl.Plan``, an ``Artifact`` or its JSON)."""
    from ._pipeline import check_pipeline as check

    return check(plan, budget=_budget(budget), catalog=catalog, file=file)


def check_workflow(source: Any, *, budget: Any = None, file: str | None = None) -> Report:
    """The findings of a workflow definition (a dict, JSON/YAML text, a ``Definition``)."""
    from ._workflow import check_workflow as check

    return check(source, budget=_budget(budget), file=file)


def check_time(target: Any, *, kind: Kind | None = None, budget: Any = None) -> Report:
    """Check the worst-case time of ``target`` before it runs, and report contradictions.

    ``target`` is a file (a path: a ``.cst`` program, a ``.py`` module of policies, a pipeline
    plan or a workflow definition in JSON or YAML; ``kind`` names it when the file does not
    say), a dotted module name with ``kind="policy"``, or an object: a ``Policy``, a function
    decorated with ``resilient``, a module, a compiled Constellation ``Program``, a ``pl.Plan``
    or ``Artifact``, a workflow ``Definition``. ``budget`` is the caller's budget (``"2s"``,
    seconds, a ``timedelta``): the deadline the checked thing runs under, if one is known.

    Returns a :class:`Report`; ``report.ok`` is false when an error-level finding exists.
    Raises an :class:`~timebound.InvalidInput` for input the check or the engine cannot read.
    """
    if kind is not None and kind not in KINDS:
        raise CheckInputError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    seconds = _budget(budget)
    if isinstance(target, types.ModuleType):
        return check_module(target, budget=seconds)
    if not isinstance(target, str | os.PathLike):
        return _check_object(target, seconds)
    name = os.fspath(target)
    if kind == "policy" or (kind is None and not os.path.exists(name) and _dotted(name)):
        return check_module(import_policies(name), budget=seconds)
    text = read(name)
    kind = kind or detect(name, text)
    if kind == "policy":
        return check_module(import_policies(name), budget=seconds)
    if kind == "constellation":
        return check_constellation(text, budget=seconds, file=name)
    if kind == "pipeline":
        return check_pipeline(text, budget=seconds, file=name)
    return check_workflow(_workflow_text(name, text), budget=seconds, file=name)


def _workflow_text(name: str, text: str) -> str:
    # parse_definition reads a one-line string ending in .json as a path: pass the text, which
    # always parses as a document (a newline keeps it from being taken for a path).
    return text if "\n" in text else text + "\n"


#: Suffixes that make a name a file, never a dotted module name.
_FILE_SUFFIXES = frozenset({".cst", ".py", ".json", ".yaml", ".yml"})


def _dotted(name: str) -> bool:
    """Whether ``name`` reads as a dotted module name (``pkg.policies``), not a file."""
    if Path(name).suffix.lower() in _FILE_SUFFIXES:
        return False
    return all(part.isidentifier() for part in name.split("."))


def _check_object(target: Any, budget: float | None) -> Report:
    from ..policies import Policy

    if isinstance(target, Policy) or isinstance(getattr(target, "policy", None), Policy):
        return check_policy(target, budget=budget)
    kind = type(target).__module__
    if kind.startswith("timebound.dsl"):
        source = getattr(target, "source", None)  # a compiled Program keeps its text
        if isinstance(source, str):
            return check_constellation(source, budget=budget)
    if kind.startswith("timebound.pipeline"):
        return check_pipeline(target, budget=budget)
    if kind.startswith("timebound.workflow"):
        return check_workflow(target, budget=budget)
    raise CheckInputError(
        f"cannot check {type(target).__name__} objects: give a file path, a module, a Policy "
        "or a decorated function, a pipeline Plan or Artifact, or a workflow Definition"
    )
