"""A reserve for the answer (D1.18-D1.20): under ``fail_after(2, reserve=...)`` everything sees the
deadline earlier by the reserve, while the scope itself ends at its own deadline."""

from __future__ import annotations

import asyncio
import math
import pickle

import pytest

import timebound as tb
from timebound.testing import VirtualClock

# What the body sees and what the scope enforces ---------------------------------------------


async def test_everything_under_the_scope_sees_the_deadline_less_the_reserve(
    virtual_clock: VirtualClock,
) -> None:
    start = virtual_clock.now()
    async with tb.fail_after(2, reserve="50ms") as scope:
        assert tb.current_deadline().when == pytest.approx(start + 1.95)
        assert tb.remaining() == pytest.approx(1.95)
        assert scope.deadline.when == pytest.approx(start + 2)
    assert tb.current_deadline() == tb.Deadline.never()


async def test_the_body_itself_is_cancelled_at_the_scope_own_deadline(
    virtual_clock: VirtualClock,
) -> None:
    """(a) Code directly in the body has the reserve: it is cancelled only at 2 s, not 1.95 s."""
    start = virtual_clock.now()
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(2, reserve="50ms", what="handler"):
            await asyncio.sleep(10)
    assert virtual_clock.now() - start == pytest.approx(2.0)
    assert info.value.set_by == "handler"


async def test_a_nested_longer_scope_ends_at_the_reserved_instant(
    virtual_clock: VirtualClock,
) -> None:
    """(b)/(c) A nested fail_after(10) would take the fast non-binding path without the reserve
    frame's own chain; it must end at 1.95 s and say the reserve did it."""
    start = virtual_clock.now()
    async with tb.fail_after(2, reserve="50ms", what="handler"):
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(10, what="query"):
                await asyncio.sleep(10)
        stopped = virtual_clock.now() - start
        # The answer: the reserve is still there to use, and awaits still work.
        await asyncio.sleep(0.04)
    assert stopped == pytest.approx(1.95)
    assert info.value.set_by == "reserve of handler"
    assert info.value.source == "scope"
    assert "reserve" in str(info.value) and "50ms" in str(info.value)
    assert info.value.deadline is not None
    assert info.value.deadline.when == pytest.approx(start + 1.95)


async def test_a_nested_scope_under_a_nested_scope_keeps_the_fast_path_correct(
    virtual_clock: VirtualClock,
) -> None:
    """The second level under the reserve is non-binding relative to the first: still 1.95 s."""
    start = virtual_clock.now()
    async with tb.move_on_after(2, reserve=0.05):
        with pytest.raises(tb.DeadlineExceeded):
            async with tb.fail_after(10):
                async with tb.fail_after(20):
                    await asyncio.sleep(10)
        assert virtual_clock.now() - start == pytest.approx(1.95)


async def test_a_nested_earlier_scope_still_binds_itself(virtual_clock: VirtualClock) -> None:
    start = virtual_clock.now()
    async with tb.fail_after(2, reserve="50ms"):
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(1, what="query"):
                await asyncio.sleep(10)
    assert virtual_clock.now() - start == pytest.approx(1.0)
    assert info.value.set_by == "query"


async def test_the_reserve_applies_to_the_enclosing_effective_deadline(
    virtual_clock: VirtualClock,
) -> None:
    """The reserve is taken from the effective deadline at the scope, whoever set it: a scope
    whose own budget is later than the enclosing one (the fast non-binding path) included."""
    start = virtual_clock.now()
    with tb.inherit_deadline(tb.Deadline.after(1), set_by="ASGI middleware"):
        async with tb.fail_after(10, reserve="100ms", what="handler"):
            assert tb.current_deadline().when == pytest.approx(start + 0.9)
        async with tb.fail_after(5):
            async with tb.fail_after(10, reserve="100ms", what="handler"):
                assert tb.remaining() == pytest.approx(0.9)
                with pytest.raises(tb.DeadlineExceeded) as info:
                    async with tb.fail_after(30):
                        await asyncio.sleep(10)
    assert virtual_clock.now() - start == pytest.approx(0.9)
    # The source is that of the bound the reserve shortened (D2.5 reads it: never retried).
    assert (info.value.source, info.value.set_by) == ("inherited", "reserve of handler")


async def test_move_on_ends_quietly_when_its_reserve_stops_the_body(
    virtual_clock: VirtualClock,
) -> None:
    async with tb.move_on_after(2, reserve="50ms") as scope:
        async with tb.fail_after(10):
            await asyncio.sleep(10)
    assert scope.expired


async def test_fail_lets_the_reserve_error_through(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(2, reserve="50ms") as scope:
            async with tb.fail_after(10):
                await asyncio.sleep(10)
    assert scope.expired
    assert info.value.set_by == "reserve of scope"


async def test_absolute_scopes_take_a_reserve(virtual_clock: VirtualClock) -> None:
    start = virtual_clock.now()
    async with tb.fail_at(tb.Deadline.after(1), reserve="200ms"):
        assert tb.remaining() == pytest.approx(0.8)
    async with tb.move_on_at(tb.Deadline.after(1), reserve="200ms") as scope:
        async with tb.fail_after(5):
            await asyncio.sleep(5)
    assert scope.expired
    assert virtual_clock.now() - start == pytest.approx(0.8)


async def test_a_child_task_sees_the_reserve_and_spawn_background_does_not(
    virtual_clock: VirtualClock,
) -> None:
    seen: dict[str, float] = {}

    async def look(name: str) -> None:
        seen[name] = tb.remaining()

    async with tb.fail_after(2, reserve="500ms"):
        await asyncio.create_task(look("child"))
        await tb.spawn_background(look("background"))
    assert seen == {"child": pytest.approx(1.5), "background": math.inf}


async def test_a_child_task_scope_ends_at_the_reserved_instant(
    virtual_clock: VirtualClock,
) -> None:
    start = virtual_clock.now()

    async def child() -> None:
        async with tb.fail_after(10):
            await asyncio.sleep(10)

    async with tb.fail_after(2, reserve="500ms"):
        with pytest.raises(tb.DeadlineExceeded) as info:
            await asyncio.create_task(child())
        assert virtual_clock.now() - start == pytest.approx(1.5)
    assert info.value.set_by == "reserve of scope"


async def test_reserves_nest(virtual_clock: VirtualClock) -> None:
    """Each scope keeps its own reserve from what it sees: per hop, they add up."""
    async with tb.fail_after(2, reserve="100ms"):
        async with tb.fail_after(10, reserve="200ms"):
            assert tb.remaining() == pytest.approx(1.7)
        assert tb.remaining() == pytest.approx(1.9)


async def test_no_deadline_means_no_reserve(virtual_clock: VirtualClock) -> None:
    async with tb.fail_after(None, reserve="1s"):
        assert tb.current_deadline() == tb.Deadline.never()


async def test_a_checkpoint_in_the_body_reports_the_reserve(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(2, reserve="50ms", what="handler"):
            virtual_clock.advance(1.96)
            await tb.acheckpoint()
    assert info.value.set_by == "reserve of handler"


# Refusal and bad input -----------------------------------------------------------------------


async def test_a_reserve_larger_than_what_is_left_refuses_at_once(
    virtual_clock: VirtualClock,
) -> None:
    ran = False
    with tb.inherit_deadline(tb.Deadline.after(0.03), set_by="caller"):
        for make in (tb.fail_after, tb.move_on_after):
            with pytest.raises(tb.DeadlineExceeded) as info:
                async with make(2, reserve="50ms", what="handler"):
                    ran = True
            assert info.value.set_by == "reserve of handler"
            assert info.value.source == "inherited"
            assert "refused" in str(info.value) and "reserve of 50ms" in str(info.value)
        # The refused scopes left nothing behind: the context is the inherited bound again.
        assert tb.remaining() == pytest.approx(0.03)
    assert not ran
    assert tb.current_deadline() == tb.Deadline.never()


async def test_a_reserve_equal_to_the_budget_refuses(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded, match="refused"):
        async with tb.fail_after(1, reserve="1s"):
            pass


@pytest.mark.parametrize("bad", [-1, "-5ms", math.nan, math.inf, "soon", True])
def test_an_invalid_reserve_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(tb.ConfigurationError) as info:
        tb.fail_after(1, reserve=bad)  # type: ignore[arg-type]
    assert info.value.option == "reserve"


def test_a_zero_reserve_is_a_plain_scope() -> None:
    assert type(tb.fail_after(1, reserve=0)) is tb.CancelScope


async def test_the_reserve_error_pickles(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(2, reserve="50ms", what="handler"):
            async with tb.fail_after(10):
                await asyncio.sleep(10)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.set_by, str(again)) == ("reserve of handler", str(info.value))


# Sync (cooperative) --------------------------------------------------------------------------


def test_sync_checkpoint_under_a_nested_scope_stops_at_the_reserved_instant(
    virtual_clock: VirtualClock,
) -> None:
    with tb.move_on_after(2, reserve="50ms") as outer:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(10):
                virtual_clock.advance(1.94)
                tb.checkpoint()
                virtual_clock.advance(0.01)
                tb.checkpoint()
        assert info.value.set_by == "reserve of scope"
        # The scope's own deadline is not reached: the body still has the reserve.
        assert not outer.expired
    assert not outer.expired


def test_sync_move_on_swallows_its_reserve(virtual_clock: VirtualClock) -> None:
    with tb.move_on_after(2, reserve="50ms") as scope:
        virtual_clock.advance(1.95)
        tb.checkpoint()
    assert scope.expired


# trio ------------------------------------------------------------------------------------------


def test_trio_nested_scope_ends_at_the_reserved_instant(virtual_clock: VirtualClock) -> None:
    trio = pytest.importorskip("trio")

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as own:
            async with tb.fail_after(2, reserve="50ms", what="handler"):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    with tb.fail_after(10):
                        await trio.sleep(10)
                assert trio.current_time() == pytest.approx(1.95)
                assert info.value.set_by == "reserve of handler"
                await trio.sleep(10)  # the body's own await: the scope's own 2 s
        assert trio.current_time() == pytest.approx(2.0)
        assert own.value.set_by == "handler"

    trio.run(main, clock=virtual_clock.trio_clock())
