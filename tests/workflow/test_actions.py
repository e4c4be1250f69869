"""How an action attempt's DeadlineExceeded is judged: the node's timeout or the action's error."""

from __future__ import annotations

import asyncio
from typing import Any

from timebound import DeadlineExceeded, fail_after
from timebound._core import _clock
from timebound._core._deadline import Deadline
from timebound.workflow._actions import ActionContext, run_python


def _ctx(deadline: Deadline) -> ActionContext:
    return ActionContext(
        input=None,
        state={},
        branch=None,
        run_id="r",
        token_id="t",
        node_id="A",
        attempt=1,
        deadline=deadline,
    )


async def _run(handler: Any, deadline: Deadline) -> Any:
    return await run_python(handler, _ctx(deadline), what="node 'A'", on_late=lambda: None)


async def test_nodes_own_bound_is_a_timeout_at_its_instant(virtual_clock) -> None:
    """A handler outliving the node's deadline ends as a timeout exactly at that deadline."""
    start = _clock.now()

    async def slow(ctx: ActionContext) -> None:
        await asyncio.sleep(60)

    outcome = await _run(slow, Deadline.after(5))
    assert outcome.kind == "timeout" and _clock.now() == start + 5


async def test_remote_expiry_with_time_left_is_an_error(virtual_clock) -> None:
    """A downstream's propagated expiry while the node still has time is the action's error."""

    async def refused(ctx: ActionContext) -> None:
        raise DeadlineExceeded("downstream spent its budget", source="propagated")

    outcome = await _run(refused, Deadline.after(5))
    assert outcome.kind == "error" and "downstream spent its budget" in (outcome.error or "")


async def test_bound_inside_the_handler_is_an_error(virtual_clock) -> None:
    """A bound the handler set itself firing first is the action failing, not the node."""

    async def inner(ctx: ActionContext) -> None:
        async with fail_after(1):
            await asyncio.sleep(60)

    outcome = await _run(inner, Deadline.after(5))
    assert outcome.kind == "error" and "DeadlineExceeded" in (outcome.error or "")
