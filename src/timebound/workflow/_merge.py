"""Dotted paths in a run's context and the four fan-in merge strategies (D6.9)."""

from __future__ import annotations

from typing import Any

__all__ = ["get_path", "merge_outputs", "set_path"]

_MISSING = object()


def get_path(root: dict[str, Any], path: str) -> Any:
    """The value at ``a.b.c`` in ``root``; :class:`KeyError` naming the path if absent."""
    value: Any = root
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def set_path(root: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b.c`` in ``root``, creating objects on the way (not through other values)."""
    parts = path.split(".")
    node = root
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise TypeError(f"cannot set {path!r}: {part!r} holds a {type(nxt).__name__}")
        node = nxt
    node[parts[-1]] = value


def merge_outputs(strategy: str, outputs: list[tuple[int, Any]]) -> Any:
    """Merge ``(branch_index, value)`` pairs; the order never depends on arrival order (D6.9)."""
    ordered = sorted(outputs, key=lambda pair: pair[0])
    if strategy == "append":
        return [value for _, value in ordered]
    if strategy == "keyed_by_branch":
        return {str(index): value for index, value in ordered}
    if strategy == "last_wins":
        return ordered[-1][1] if ordered else {}
    merged: dict[str, Any] = {}  # merge_object: shallow, the higher branch index wins
    for index, value in ordered:
        if not isinstance(value, dict):
            raise TypeError(
                f"merge_object needs objects, but branch {index} produced a {type(value).__name__}"
            )
        merged.update(value)
    return merged
