"""Ranking pipelines on Arrow with region deadlines (``timeout_wrapper``, RFC 0002).

Needs the ``pipeline`` extra (pyarrow). See docs/pipeline.md.
"""

from ._artifact import CAPABILITY, Artifact
from ._compiler import compile
from ._engine import Engine, Result, TaskContext
from ._errors import PlanTimeout, TaskError, ValidationError
from ._expr import Expr, col, lit
from ._model import (
    FromParam,
    KeyDef,
    P,
    ParamDef,
    Registry,
    Switch,
    TaskSpec,
    Union,
    Unknown,
)
from ._plan import Chain, Plan
from ._trace import Trace

__all__ = [
    "CAPABILITY",
    "Artifact",
    "Chain",
    "Engine",
    "Expr",
    "FromParam",
    "KeyDef",
    "P",
    "ParamDef",
    "Plan",
    "PlanTimeout",
    "Registry",
    "Result",
    "Switch",
    "TaskContext",
    "TaskSpec",
    "TaskError",
    "Trace",
    "Union",
    "Unknown",
    "ValidationError",
    "col",
    "compile",
    "lit",
]
