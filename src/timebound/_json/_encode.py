"""JSON text of values timebound made or already checked (stored rows, event data).

``json.dumps`` builds a new C encoder for every call and goes through two Python layers to reach
it: for the small documents a durable engine writes per step (each event's data, a token's
output, a run's state) that is most of its cost. :func:`dumps` calls one encoder made once, with
``json.dumps``'s defaults and the same text. It does not look for reference cycles (no value it
is given has one: each was decoded from JSON, checked, or built by the engine from such values);
a cycle ends in ``RecursionError`` instead of ``ValueError``.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any

__all__ = ["dumps"]


def _unserializable(obj: Any) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_make: Any = getattr(json.encoder, "c_make_encoder", None)
# markers=None (no cycle check), default, ASCII strings, no indent, ": ", ", ", unsorted keys,
# no skipped keys, NaN allowed: json.dumps(value) with no options.
_encode: Callable[[Any, int], list[str]] | None = (
    None
    if _make is None
    else _make(
        None,
        _unserializable,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        True,
    )
)


def dumps(value: Any) -> str:
    """``json.dumps(value)``, the same text, without its per-call cost."""
    if _encode is None:  # an interpreter without json's C accelerator
        return json.dumps(value)
    return "".join(_encode(value, 0))
