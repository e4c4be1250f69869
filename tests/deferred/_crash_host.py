"""A host process for the kill -9 test: ``setup URL`` creates operations, ``run URL LOG`` polls.

The connector is in-process and deterministic: an operation of kind ``slow.job`` completes once
its ``complete_after`` (encoded in its id, in ms) has passed, ``stuck.job`` never does. Every
poll appends ``op_id poll_ms next_poll_ms`` to LOG before answering, so the parent can check
that no poll came before its stored instant. Resumes insert a row in ``crash_resumes`` inside
the resuming transaction, so a duplicate resume would show as a second row.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.deferred.conftest import operation_doc, status_doc
from timebound.deferred import (
    CONTINUATION_SCHEMA,
    HostPolicy,
    Operation,
    Poller,
    Registry,
    Resumption,
)
from timebound.deferred._registry import now_ms

POLICY = HostPolicy(jitter=False, min_retry_after=1, max_ttl=3600)


def _cont(op_id: str) -> dict[str, Any]:
    return {"schema": CONTINUATION_SCHEMA, "resume_kind": "crash", "op": op_id}


async def setup(url: str) -> None:
    async with Registry(url, policy=POLICY) as reg:
        async with reg.store.transaction() as tx:
            await tx.execute("CREATE TABLE crash_resumes (op_id TEXT NOT NULL, status TEXT)")
        for i in range(20):  # pending, completing 0..3.8 s after creation
            op_id = f"deferred:slow.job:p{i}x{i * 200}"
            await reg.register(
                operation_doc(op_id, retry_after=1, ttl_s=3600),
                module="m",
                continuation=_cont(op_id),
            )
        for i in range(10):  # completed, not yet resumed
            op_id = f"deferred:slow.job:c{i}x0"
            await reg.register(
                operation_doc(op_id, retry_after=1, ttl_s=3600),
                module="m",
                continuation=_cont(op_id),
            )
            await reg.apply_status(op_id, status_doc(op_id, status="completed", result={"i": i}))
        for i in range(10):  # expire after 1 s, never completing
            op_id = f"deferred:stuck.job:e{i}"
            await reg.register(
                operation_doc(op_id, retry_after=1, ttl_s=1), module="m", continuation=_cont(op_id)
            )


class Connector:
    def __init__(self, log: Any) -> None:
        self.log = log

    async def status(self, op: Operation) -> object:
        at = now_ms()
        self.log.write(f"{op.id} {at} {op.next_poll_ms}\n")
        self.log.flush()
        os.fsync(self.log.fileno())
        if op.kind == "slow.job" and at >= op.created_ms + int(op.id.rsplit("x", 1)[1]):
            return status_doc(op.id, status="completed", result={"op": op.id})
        return status_doc(op.id, retry_after_seconds=1)

    async def cancel(self, op: Operation) -> object:
        raise AssertionError("not used")


async def run(url: str, log_path: str) -> None:
    async def resume(tx: Any, r: Resumption) -> None:
        await tx.execute(
            "INSERT INTO crash_resumes (op_id, status) VALUES (?, ?)",
            r.operation.id,
            r.operation.status,
        )

    with open(log_path, "a", encoding="utf-8") as log:
        async with Registry(url, policy=POLICY) as reg:
            reg.on_resume("crash", resume)
            async with Poller(reg, {"m": Connector(log)}):
                print("started", flush=True)
                while True:
                    async with reg.store.transaction() as tx:
                        row = await tx.fetchone(
                            "SELECT COUNT(*) AS n FROM tb_deferred_ops WHERE resumed_ms IS NULL"
                        )
                    if row is not None and row["n"] == 0:
                        break
                    await asyncio.sleep(0.05)
    print("done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        asyncio.run(setup(sys.argv[2]))
    else:
        asyncio.run(run(sys.argv[2], sys.argv[3]))
