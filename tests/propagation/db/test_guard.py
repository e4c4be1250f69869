"""``run_guarded``: only the statement is ever interrupted; the bookkeeping always finishes."""

from __future__ import annotations

import asyncio

import pytest

import timebound as tb
from timebound.propagation._client import Attempt, AttemptTimeoutBase, begin
from timebound.propagation.db._common import Guard, options, run_guarded

pytestmark = pytest.mark.asyncio_real


def attempt() -> Attempt:
    """A database call's attempt under the current deadline (none: unbounded)."""
    return begin(None, options("test", "q"), AttemptTimeoutBase)


class Steps:
    """A guarded call's steps as they happened: bookkeeping before and after a statement."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.statement_started = asyncio.Event()
        self.release = asyncio.Event()

    async def statement(self) -> str:
        self.log.append("statement")
        self.statement_started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.log.append("statement interrupted")
            raise
        return "result"

    async def body(self, guard: Guard) -> str:
        self.log.append("begin")
        try:
            return await guard.statement(self.statement)
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            self.log.append("end")


async def test_plain_cancel_interrupts_the_statement_and_waits_for_the_cleanup() -> None:
    """``task.cancel()`` with time left interrupts the statement at once; the caller's
    CancelledError goes on only after the cleanup ran."""
    steps = Steps()
    task = asyncio.ensure_future(run_guarded(steps.body, attempt(), grace=5))
    await steps.statement_started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps.log == ["begin", "statement", "statement interrupted", "end"]


async def test_a_caller_cancelled_twice_interrupts_the_statement_once() -> None:
    """The caller cancelled again while its interrupted statement winds down (a driver asking
    the server to cancel it): the statement is not interrupted a second time, which makes
    psycopg close the connection."""
    log: list[str] = []
    started = asyncio.Event()
    winding_down = asyncio.Event()
    finish = asyncio.Event()

    async def statement() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            log.append("interrupted")
            winding_down.set()
            try:
                await finish.wait()  # the driver's own cancellation handling
            except asyncio.CancelledError:
                log.append("interrupted again")
            raise

    async def body(guard: Guard) -> None:
        await guard.statement(statement)

    task = asyncio.ensure_future(run_guarded(body, attempt(), grace=5))
    await started.wait()
    task.cancel()
    await winding_down.wait()
    task.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["interrupted"]


async def test_cancel_during_the_bookkeeping_skips_the_statement() -> None:
    """A cancel that lands before the statement started: the statement is never run, the
    bookkeeping still finishes."""
    steps = Steps()
    gate = asyncio.Event()

    async def body(guard: Guard) -> str:
        steps.log.append("begin")
        await gate.wait()  # the caller is cancelled while this bookkeeping waits
        try:
            return await guard.statement(steps.statement)
        finally:
            steps.log.append("end")

    task = asyncio.ensure_future(run_guarded(body, attempt(), grace=5))
    while steps.log != ["begin"]:
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)  # the caller takes its cancellation while the bookkeeping waits
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps.log == ["begin", "end"]


async def test_deadline_cancel_leaves_the_statement_to_end_by_itself() -> None:
    """A cancelling scope firing at the deadline does not interrupt the statement (the server
    ends it): the call finishes, then the scope raises its own error."""
    steps = Steps()

    async def answer_after_the_deadline() -> None:
        await steps.statement_started.wait()
        await asyncio.sleep(0.15)
        steps.release.set()

    server = asyncio.ensure_future(answer_after_the_deadline())
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(0.05):
            await run_guarded(steps.body, attempt(), grace=30)
    await server
    assert steps.log == ["begin", "statement", "end"]


async def test_deadline_cancel_interrupts_a_statement_that_never_ends_after_the_grace() -> None:
    """If the statement has not ended ``grace`` seconds after the deadline's cancel (a server
    that stopped answering), it is interrupted, and the scope still reports itself."""
    steps = Steps()
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(0.05):
            await run_guarded(steps.body, attempt(), grace=0.05)
    assert steps.log == ["begin", "statement", "statement interrupted", "end"]
