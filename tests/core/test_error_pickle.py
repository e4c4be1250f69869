"""Every DeadlineExceeded, subclasses included, pickles whole (D2.4): its class, message, which
bound fired, where it was set, the deadline and the breakdown travel to another process, so an
error re-raised by ``run_in_process`` or a worker says what the original said."""

from __future__ import annotations

import pickle
from typing import Any

import aiohttp  # noqa: F401 -- the adapters below need their client libraries
import pytest

import timebound as tb
from timebound._core import _clock, _scopes
from timebound.pipeline import PlanTimeout
from timebound.propagation import aiohttp as tb_aiohttp
from timebound.propagation import httpx as tb_httpx
from timebound.propagation import requests as tb_requests
from timebound.propagation.grpc import AioPropagatedDeadlineExceeded, PropagatedDeadlineExceeded
from timebound.testing import VirtualClock


def _fired_breakdown(clock: VirtualClock) -> tb.Breakdown:
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            t0 = _clock.now()
            clock.advance(0.6)
            _scopes.record("call", "GET /slow", t0, _clock.now(), 1.0, "ok")
            clock.advance(0.5)
    bd = info.value.breakdown
    assert bd is not None
    return bd


def _subclasses() -> list[tuple[str, Any]]:
    return [
        ("plan timeout", lambda: PlanTimeout(node_id="r1", timeout_ms=250.0)),
        ("httpx", lambda: tb_httpx.AttemptTimeout("GET / timed out", remote=True, timeout=1.5)),
        (
            "requests",
            lambda: tb_requests.AttemptTimeout("GET / timed out", remote=True, timeout=1.5),
        ),
        ("aiohttp", lambda: tb_aiohttp.AttemptTimeout("GET / timed out", timeout=1.5)),
        (
            "grpc",
            lambda: PropagatedDeadlineExceeded(
                "x timed out", details="d", trailing_metadata=object(), timeout=0.25
            ),
        ),
        ("grpc aio", lambda: AioPropagatedDeadlineExceeded("x timed out", details="d")),
    ]


@pytest.mark.parametrize("case", range(len(_subclasses())))
def test_a_subclass_keeps_its_breakdown_set_by_and_deadline(
    case: int, virtual_clock: VirtualClock
) -> None:
    name, make = _subclasses()[case]
    bd = _fired_breakdown(virtual_clock)
    err = make()
    err.breakdown = bd
    err.set_by = "policy GetUser"
    err.deadline = tb.Deadline.after(3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err), name
    assert str(back) == str(err), name
    assert back.args == err.args, name
    assert (back.source, back.timeout, back.set_by) == (err.source, err.timeout, err.set_by), name
    assert back.deadline == err.deadline, name
    assert back.breakdown == bd, name


def test_live_call_objects_arrive_as_none() -> None:
    """The gRPC call's metadata objects need not pickle: they come back as None, and the
    accessors still answer."""
    err = PropagatedDeadlineExceeded("x", details="d", trailing_metadata=lambda: None)
    back = pickle.loads(pickle.dumps(err))
    assert back.trailing_metadata() is None and back.details() == "d"


def test_a_message_is_not_doubled_by_the_summary(virtual_clock: VirtualClock) -> None:
    """str() appends the breakdown's summary; the pickled message must not carry it already
    (a second round trip would print it twice)."""
    err = PlanTimeout(node_id="r1", timeout_ms=250.0)
    err.breakdown = _fired_breakdown(virtual_clock)
    twice = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(err))))
    assert str(twice) == str(err)
    assert str(err).count("[") == str(twice).count("[")
