"""JSON documents that someone else wrote: reading them strictly and checking them against the
JSON Schemas timebound ships.

One implementation for every engine (workflow definitions, deferred-operation documents, pipeline
plans), so that the draft, the format checks, the regular-expression dialect, which error is
reported first and how its place is written never drift apart between them.
"""

from ._encode import dumps
from ._schema import SchemaProblem, SchemaValidator, json_path
from ._strict import MAX_DEPTH, JSONError, TooDeep, check, loads

__all__ = [
    "MAX_DEPTH",
    "JSONError",
    "SchemaProblem",
    "SchemaValidator",
    "TooDeep",
    "check",
    "dumps",
    "json_path",
    "loads",
]
