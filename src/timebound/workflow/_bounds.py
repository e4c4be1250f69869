"""Which bound sets a run's deadline and which one fired (D6.17), how a run ended as a stored
code, and the idempotency key of a token's call (D7.11)."""

from __future__ import annotations

import json
from typing import Any

from ._definition import Definition
from ._rows import decode

__all__ = [
    "NODE_TIMEOUT",
    "WORKFLOW_TIMEOUT",
    "WORKFLOW_TIMEOUT_ERROR",
    "call_key",
    "run_bound",
    "stored_bound",
]

#: Stored codes of how a run ended (``tb_wf_runs.error_code``), read instead of its message.
WORKFLOW_TIMEOUT = "workflow_timeout"
NODE_TIMEOUT = "node_timeout"
WORKFLOW_TIMEOUT_ERROR = "Workflow exceeded timeout"


def call_key(tok: dict[str, Any]) -> str:
    """The idempotency key of a token's current call (D7.11): run, token and node, the same
    when a crash re-runs the call; a deliberate retry (an action error's retry block, an
    ``on_timeout: retry``) is a new call and gets ``:<n>``, its number among them."""
    state_data = tok["state_data"]
    # Decoded only when it may count re-runs (most tokens never re-ran: "{}").
    reruns = (decode(state_data) or {}).get("reruns", 0) if '"reruns"' in (state_data or "") else 0
    retries = tok["attempt"] - 1 - reruns
    key = f"{tok['run_id']}:{tok['id']}:{tok['node_id']}"
    return key if retries <= 0 else f"{key}:{retries}"


def run_bound(
    now: int,
    timeout_ms: int | None,
    timeout_set_by: str,
    inherited_at: int | None,
    inherited_set_by: str,
) -> dict[str, Any] | None:
    """The bound that sets a run's deadline (D6.17): its own timeout from ``now`` or the
    inherited instant, whichever is earlier; at a tie the inherited one (the larger scope,
    as D6.4). ``None`` when neither is present."""
    own = None if timeout_ms is None else now + timeout_ms
    if inherited_at is not None and (own is None or inherited_at <= own):
        return {
            "set_by": inherited_set_by,
            "duration_ms": max(0, inherited_at - now),  # already passed: none left
            "deadline_at": inherited_at,
        }
    if own is None:
        return None
    return {"set_by": timeout_set_by, "duration_ms": timeout_ms, "deadline_at": own}


def stored_bound(run: dict[str, Any], definition: Definition) -> dict[str, Any]:
    """The bound stored with a run (D6.17); for a run stored without one, its definition's."""
    stored = run.get("timeout_bound")
    if isinstance(stored, str):
        stored = json.loads(stored)
    if stored:
        return stored  # type: ignore[no-any-return]
    return {
        "set_by": "definition",
        "duration_ms": definition.timeout_ms,
        "deadline_at": run.get("timeout_at"),
    }
