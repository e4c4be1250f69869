"""A poll that ends while the poller's round still runs must not lose its wake-up.

Found by 200 kill -9 runs on PostgreSQL: the last polls of a round completed their operations
while the round read its next instant; the loop then cleared the wake-up they had set and slept
forever (nothing was due any more), so the completed operations were never resumed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from timebound.deferred import CONTINUATION_SCHEMA, HostPolicy, Operation, Poller, Registry

from .conftest import operation_doc, status_doc

OP = "deferred:report.render:wake1"


class _Connector:
    async def status(self, op: Operation) -> object:
        return status_doc(op.id, status="completed", result={"pages": 1})

    async def cancel(self, op: Operation) -> object:
        raise AssertionError("not used")


class _LateRead(Registry):
    """Holds a round's last query until the poll it started has been applied: the race, made
    certain instead of likely."""

    poller: Poller | None = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.applied = asyncio.Event()

    async def polled_many(self, answers: list[tuple[str, object]]) -> Any:
        # The poller applies a round's answers through this one write path (``polled`` too).
        outcomes = await super().polled_many(answers)
        self.applied.set()
        return outcomes

    async def next_instant(self, after_ms: int) -> int | None:
        if self.poller is not None and self.poller._polling:
            await self.applied.wait()
        return await super().next_instant(after_ms)


async def test_a_poll_ending_during_the_round_still_resumes(store_url: str, clock: Any) -> None:
    """The operation completes on the round's own poll; it resumes at once, not never."""

    async def resume(tx: Any, resumption: Any) -> None:
        pass  # resumed_ms, written in the same transaction, is what the test reads

    async with _LateRead(store_url, policy=HostPolicy(jitter=False)) as reg:
        reg.on_resume("report", resume)
        cont = {"schema": CONTINUATION_SCHEMA, "resume_kind": "report"}
        await reg.register(operation_doc(OP, retry_after=1), module="m", continuation=cont)
        async with Poller(reg, {"m": _Connector()}) as poller:
            reg.poller = poller
            for _ in range(3000):  # 30 virtual seconds; before the fix: never
                op = await reg.get(OP)
                if op is not None and op.resumed_ms is not None:
                    break
                await asyncio.sleep(0.01)
    assert op is not None and op.status == "completed" and op.resumed_ms is not None
