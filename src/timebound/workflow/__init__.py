"""Durable workflows with workflow, node and fan-in timeouts (docs/workflows.md).

A definition is data (JSON, YAML or a dict) checked against the JSON Schema shipped with the
package; :class:`Engine` runs it durably on SQLite (embedded) or PostgreSQL (many workers), with the
three timeout layers as durable timers::

    from timebound import workflow as wf

    engine = wf.Engine(db="sqlite:///runs.db", actions={"fetch": fetch})
    engine.register(definition)
    async with engine:
        run_id = await engine.start("research", input={"q": "..."})
        result = await engine.wait(run_id)
"""

from __future__ import annotations

# The store's errors reach workflow users (StoreBusy: another process already writes a SQLite
# store): catchable by name from here (D2.6).
from .._store import StoreBusy, StoreError
from ._actions import ActionContext
from ._definition import (
    Definition,
    DefinitionConflict,
    DefinitionError,
    DefinitionTooDeep,
    DefinitionTooLarge,
    parse_definition,
    schema,
)
from ._engine import Engine, RunResult
from ._operator import OperatorRefused
from ._starts import StartConflict, started_run_id

__all__ = [
    "ActionContext",
    "Definition",
    "DefinitionConflict",
    "DefinitionError",
    "DefinitionTooDeep",
    "DefinitionTooLarge",
    "Engine",
    "OperatorRefused",
    "RunResult",
    "StartConflict",
    "StoreBusy",
    "StoreError",
    "parse_definition",
    "schema",
    "started_run_id",
]
