"""Execution modes of workflow actions (D7): which nodes may defer, checked statically.

An action's ``execution_mode_support`` says what its connector may do: ``sync-only`` (the safe
default: it answers with a result), ``async-only`` (the default of kind ``deferred``: it answers
with a deferred-operation handle) or ``either``. A node's ``timing.mode`` says what it asks for;
without one it asks for what the action supports (``async`` unless ``sync-only``). A node asking
for a mode its action does not allow is a definition error naming the node's path, so the
connector is never called. Only kinds that can defer take anything but ``sync-only``.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["DEFERRABLE_KINDS", "check_modes", "default_support", "node_mode"]

Mode = Literal["sync", "async"]

#: The kinds whose connector may answer with a deferred-operation handle.
DEFERRABLE_KINDS = ("http_request", "deferred")


def default_support(kind: str) -> str:
    return "async-only" if kind == "deferred" else "sync-only"


def node_mode(support: str, requested: str | None) -> Mode:
    """The mode a node runs in: its own ``timing.mode``, else what its action allows."""
    if requested is not None:
        return "async" if requested == "async" else "sync"
    return "sync" if support == "sync-only" else "async"


def check_modes(data: dict[str, Any], error: Any) -> None:
    """Raise ``error(message, path=...)`` for a mode rule the definition breaks."""
    supports: dict[str, str] = {}
    for i, a in enumerate(data.get("actions", [])):
        support = a.get("execution_mode_support", default_support(a["kind"]))
        supports[a["id"]] = support
        where = f"actions[{i}]"
        if a["kind"] not in DEFERRABLE_KINDS:
            if support != "sync-only":
                raise error(
                    f"a {a['kind']} action cannot defer: its execution_mode_support is 'sync-only'",
                    path=f"{where}.execution_mode_support",
                )
            if "deferred_profile" in a:
                raise error(
                    f"a {a['kind']} action cannot defer, so it has no deferred_profile",
                    path=f"{where}.deferred_profile",
                )
        elif a["kind"] == "deferred" and support == "sync-only":
            raise error(
                "a deferred action answers with a handle: its execution_mode_support is "
                "'async-only' or 'either'",
                path=f"{where}.execution_mode_support",
            )
    for i, n in enumerate(data["nodes"]):
        mode = n.get("timing", {}).get("mode")
        support = supports.get(n["action_id"])
        if mode is None or support is None:
            continue
        if (mode == "async" and support == "sync-only") or (
            mode == "sync" and support == "async-only"
        ):
            raise error(
                f"timing.mode {mode!r} is not allowed by action {n['action_id']!r} "
                f"(execution_mode_support {support!r})",
                path=f"nodes[{i}].timing.mode",
            )
