"""Registries on both stores: SQLite in a temporary directory, PostgreSQL in a unique schema."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from timebound.deferred._contract import format_time
from timebound.deferred._registry import now_ms


def _drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL on each backend (the same behaviour suite runs on both)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/deferred.db"
        return
    dsn = request.getfixturevalue("postgres_dsn")
    schema = f"tbdf_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{dsn}?schema={schema}"
    finally:
        _drop_schema(dsn, schema)


def operation_doc(
    op_id: str = "deferred:report.render:op1",
    *,
    retry_after: int = 5,
    ttl_s: int = 300,
    created_ms: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A valid deferred-operation.v1 document created now (or at ``created_ms``)."""
    created = now_ms() if created_ms is None else created_ms
    doc: dict[str, Any] = {
        "schema": "deferred-operation.v1",
        "schema/v": 1,
        "status": "deferred",
        "operation/id": op_id,
        "operation/kind": op_id.split(":")[1],
        "retry_after_seconds": retry_after,
        "created_at": format_time(created),
        "expires_at": format_time(created + ttl_s * 1000),
        "status_href": f"/v1/deferred-operations/{op_id}/status",
        "cancel_href": f"/v1/deferred-operations/{op_id}/cancel",
    }
    doc.update(extra)
    return doc


def status_doc(
    op_id: str = "deferred:report.render:op1", status: str = "pending", **extra: Any
) -> dict[str, Any]:
    """A valid deferred-operation-status.v1 document."""
    doc: dict[str, Any] = {
        "schema": "deferred-operation-status.v1",
        "schema/v": 1,
        "operation/id": op_id,
        "operation/kind": op_id.split(":")[1],
        "status": status,
    }
    if status == "completed" and "result" not in extra:
        doc["result"] = {"ok": True}
    if (
        status in ("failed", "timed-out", "cancelled", "expired", "unknown")
        and "error" not in extra
    ):
        doc["error"] = {"code": status, "message": status, "retryable": False}
    doc.update(extra)
    return doc


@pytest.fixture
def clock(store_url: str, virtual_clock: Any) -> Any:
    """Virtual time; on PostgreSQL it jumps only after real idleness, never mid-query."""
    vc = virtual_clock
    if store_url.startswith("postgresql"):
        vc.autojump_threshold = 0.05
    return vc


async def raw_update(reg: Any, op_id: str, **columns: Any) -> None:
    """Change stored columns behind the registry's back (tampering, for tests)."""
    sets = ", ".join(f"{name} = ?" for name in columns)
    async with reg.store.transaction() as tx:
        await tx.execute(
            f"UPDATE tb_deferred_ops SET {sets} WHERE id = ?", *columns.values(), op_id
        )
