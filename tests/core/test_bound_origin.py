"""A DeadlineExceeded says where its bound was set (D2.8): the scope, policy, middleware or job
that set it, whichever scope it surfaced in, and it keeps saying so across a pickle."""

from __future__ import annotations

import asyncio
import pickle

import pytest

import timebound as tb
from timebound.deferred import HostPolicy
from timebound.policies import Policy
from timebound.testing import VirtualClock


async def test_a_named_scope_is_where_its_bound_was_set(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1, what="fetch"):
            await asyncio.sleep(5)
    assert (info.value.source, info.value.set_by) == ("scope", "fetch")


async def test_an_unnamed_scope_says_nobody_named_it(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            await asyncio.sleep(5)
    assert info.value.set_by is None


async def test_the_outer_scope_that_fired_is_named_not_the_inner_one(
    virtual_clock: VirtualClock,
) -> None:
    """An inner scope with a longer budget meets the outer bound: the outer one set it."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1, what="request"):
            with tb.fail_after(10, what="query"):
                await asyncio.sleep(5)
    assert info.value.set_by == "request"


async def test_a_policy_names_itself_for_its_attempt_and_total_bounds(
    virtual_clock: VirtualClock,
) -> None:
    async def slow() -> None:
        await asyncio.sleep(60)

    with pytest.raises(tb.DeadlineExceeded) as attempt:
        await Policy("GetUser", timeout=1).execute(slow)
    with pytest.raises(tb.DeadlineExceeded) as total:
        await Policy("GetUser", timeout=1, retry=5, total_timeout=2.5).execute(slow)
    assert (attempt.value.source, attempt.value.set_by) == ("attempt", "policy GetUser")
    assert (total.value.source, total.value.set_by) == ("total", "policy GetUser")


async def test_an_inherited_deadline_names_who_set_it(virtual_clock: VirtualClock) -> None:
    with tb.inherit_deadline(tb.Deadline.after(1), set_by="nightly export"):
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(30, what="step"):
                await asyncio.sleep(5)
    assert (info.value.source, info.value.set_by) == ("inherited", "nightly export")


def test_set_by_survives_a_pickle_and_is_optional() -> None:
    err = tb.DeadlineExceeded(source="node", timeout=2.0, set_by="node A")
    again = pickle.loads(pickle.dumps(err))
    assert (again.source, again.timeout, again.set_by, str(again)) == (
        "node",
        2.0,
        "node A",
        str(err),
    )
    assert tb.DeadlineExceeded().set_by is None


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, (300.0, "host policy")),
        ({"fail_after": 60}, (60.0, "connector")),
        ({"fail_after": 60, "action_max_ttl": 30}, (30.0, "action")),
        ({"fail_after": 60, "caller_deadline": 10_000 + 20_000}, (20.0, "caller")),
        ({"fail_after": 900}, (300.0, "host policy")),
        # A tie goes to the larger scope (D6.4): host policy, caller, action, connector.
        ({"fail_after": 300}, (300.0, "host policy")),
        ({"fail_after": 30, "action_max_ttl": 30}, (30.0, "action")),
        ({"action_max_ttl": 30, "caller_deadline": 10_000 + 30_000}, (30.0, "caller")),
    ],
)
def test_a_deferred_lifetime_says_which_bound_set_it(
    kwargs: dict[str, float], expected: tuple[float, str]
) -> None:
    policy = HostPolicy(max_ttl=300)
    assert policy.lifetime_bound(10_000, **kwargs) == expected  # type: ignore[arg-type]
    assert policy.lifetime_s(10_000, **kwargs) == expected[0]  # type: ignore[arg-type]


def test_a_spent_caller_deadline_is_set_by_the_caller() -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        HostPolicy().lifetime_bound(10_000, caller_deadline=9_000)
    assert (info.value.source, info.value.set_by) == ("deferred", "caller")
