"""Ranking pipelines on Arrow with region deadlines (``timeout_wrapper``, RFC 0002).

Needs the ``pipeline`` extra (pyarrow). See docs/pipeline.md.
"""

from ._artifact import CAPABILITY, Artifact
from ._compiler import compile
from ._engine import Engine, RunOutput, TaskContext
from ._errors import PlanTimeout, TaskError, ValidationError
from ._expr import Expr, col, lit
from ._model import (
    Catalog,
    FromParam,
    KeyDef,
    P,
    ParamDef,
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
    "Catalog",
    "Chain",
    "Engine",
    "Expr",
    "FromParam",
    "KeyDef",
    "P",
    "ParamDef",
    "Plan",
    "PlanTimeout",
    "RunOutput",
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

# Old names, kept for one release: each named something another package also has.
_RENAMED = {"Registry": Catalog, "Result": RunOutput}


def __getattr__(name: str) -> object:
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module 'timebound.pipeline' has no attribute {name!r}")
    import warnings

    warnings.warn(
        f"timebound.pipeline.{name} is now timebound.pipeline.{new.__name__}",
        DeprecationWarning,
        stacklevel=2,
    )
    return new
