"""Storing a definition's body under its (id, version), once and for all."""

from __future__ import annotations

import json

from .._store import Tx
from ._definition import Definition
from ._workers import store_node_needs

__all__ = ["store_definition"]


async def store_definition(tx: Tx, definition: Definition) -> str | None:
    """Store a definition's body under its (id, version) unless stored; an error message if the
    store holds another body there.

    Runs keep the version they started with, read back from the store after a restart or on
    another worker, so one (id, version) must never name two bodies.
    """
    body = json.dumps(definition.raw, sort_keys=True)
    await tx.execute(
        "INSERT INTO tb_wf_definitions (id, version, body) VALUES (?, ?, ?) "
        "ON CONFLICT (id, version) DO NOTHING",
        definition.id,
        definition.version,
        body,
    )
    row = await tx.fetchone(
        "SELECT body FROM tb_wf_definitions WHERE id = ? AND version = ?",
        definition.id,
        definition.version,
    )
    if row is not None and json.loads(row["body"]) == definition.raw:
        await store_node_needs(tx, definition)  # which workers can run its nodes (D6.15)
    if row is not None and json.loads(row["body"]) != definition.raw:
        return (
            f"definition {definition.id!r} version {definition.version} is already stored "
            "with a different body; give the new one a higher version"
        )
    return None
