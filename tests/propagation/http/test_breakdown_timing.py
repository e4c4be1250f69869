"""The breakdown a caller gets is complete and adds up to the time it observed (D13.9), on
virtual time: the callee's side of a call answered in the very step the caller's deadline cut
it, and the end of a call answered "deadline expired" whose body took time to read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

import timebound as tb
from timebound import Breakdown
from timebound.propagation.httpx import AsyncDeadlineTransport
from timebound.testing import VirtualClock

CALLEE = Breakdown("bound", "80ms", name="inherited", parts=(Breakdown("self", "80ms"),))
EXPIRED = {"X-YaTaxi-Deadline-Expired": "1", "X-Timebound-Breakdown": CALLEE.to_json()}


async def test_an_answer_in_the_step_the_deadline_cuts_the_call_brings_its_side(
    virtual_clock: VirtualClock,
) -> None:
    """The callee's 498 is on its way 1 ms before the caller's deadline, then the process
    stalls past it (here: the clock jumps 5 ms). The loop's next iteration hands the answer to
    the exchange and fires the caller's deadline together: when the caller runs, its deadline
    cuts the call first. The answer was here, so the call's part holds the callee's side."""

    async def callee(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.099)
        virtual_clock.advance(0.005)  # the process is not scheduled for 5 ms
        await asyncio.sleep(0)  # the answer is read in the iteration the deadline fires in
        return httpx.Response(498, headers=EXPIRED, content=b"Deadline expired")

    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(httpx.MockTransport(callee)))
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(0.1):
            await client.get("http://a/x")
    err = info.value
    assert err.source == "scope"  # the caller's own deadline fired: it reports itself
    bd = err.breakdown
    assert bd is not None
    [call] = [p for p in bd.parts if p.kind == "call"]
    assert call.outcome == "cut"
    assert [p.kind for p in call.parts] == ["remote", "self"], bd.render()
    assert call.parts[0].name == "inherited"
    await client.aclose()


async def _slow_body() -> AsyncIterator[bytes]:
    await asyncio.sleep(0.03)
    yield b"Deadline expired"


async def test_a_refusal_breakdown_ends_when_the_error_reaches_the_caller(
    virtual_clock: VirtualClock,
) -> None:
    """The 498's headers arrive at 40 ms, its body 30 ms later: the caller sees the error at
    70 ms, and so does its breakdown (the parts add up to what the caller observed)."""

    async def callee(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.04)
        return httpx.Response(498, headers=EXPIRED, content=_slow_body())

    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(httpx.MockTransport(callee)))
    start = virtual_clock.now()
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            await client.get("http://a/x")
    observed_ms = (virtual_clock.now() - start) * 1000
    assert observed_ms == pytest.approx(70)
    bd = info.value.breakdown
    assert bd is not None
    assert info.value.source == "propagated"
    assert bd.elapsed_ms == pytest.approx(observed_ms)
    assert sum(p.elapsed_ms for p in bd.parts) == pytest.approx(observed_ms)
    # The call is its exchange up to the answer; reading the refusal's body (and any wait for
    # the loop on the way to the caller) is the bound's own code.
    assert [(p.kind, p.elapsed_ms) for p in bd.parts] == [
        ("call", pytest.approx(40)),
        ("self", pytest.approx(30)),
    ]
    await client.aclose()
