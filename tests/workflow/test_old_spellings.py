"""The engine's old keyword spellings (lease_ms=, sweep_ms=, drain_s=) still work for one
release with a DeprecationWarning naming the new keyword (D1.12); the new ones take durations."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf
from timebound._core import _clock
from timebound.testing import VirtualClock


def _engine(tmp_path: Path, **kw: Any) -> wf.Engine:
    return wf.Engine(db=f"sqlite:///{tmp_path / 'wf.db'}", actions={}, **kw)


def test_lease_and_sweep_take_durations(tmp_path: Path) -> None:
    engine = _engine(tmp_path, lease="1500ms", sweep=2)
    assert (engine._lease_ms, engine._sweep_ms) == (1500, 2000)


@pytest.mark.parametrize(
    ("old", "new", "value", "ms"), [("lease_ms", "lease", 300, 300), ("sweep_ms", "sweep", 50, 50)]
)
def test_the_old_ms_keywords_warn_and_keep_their_meaning(
    tmp_path: Path, old: str, new: str, value: int, ms: int
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"Engine\({old}=…\) is deprecated; pass {new}="):
        engine = _engine(tmp_path, **{old: value})
    assert getattr(engine, f"_{old}") == ms


def test_a_zero_lease_is_refused_by_its_new_name(tmp_path: Path) -> None:
    with pytest.raises(tb.ConfigurationError, match="lease must be > 0"):
        _engine(tmp_path, lease=0)
    with pytest.warns(DeprecationWarning), pytest.raises(tb.ConfigurationError, match="sweep"):
        _engine(tmp_path, sweep_ms=0)


def test_the_signatures_show_durations_only() -> None:
    for method in (wf.Engine.__init__, wf.Engine.close, wf.Engine.start, wf.Engine.wait):
        names = set(inspect.signature(method).parameters)
        assert not {n for n in names if n.endswith(("_ms", "_s"))}, method


def _flow(action: str) -> dict[str, Any]:
    return {
        "id": "flow",
        "initial_node": "a",
        "actions": [{"id": action, "kind": "python", "implementation": {"handler": action}}],
        "nodes": [{"id": "a", "action_id": action}],
        "transitions": [],
    }


async def test_close_drain_s_warns_and_drains(
    virtual_clock: VirtualClock, make_engine: Callable[..., wf.Engine]
) -> None:
    """close(drain_s=2) is close(drain=2): a 1 s attempt in flight finishes and is stored."""

    async def nap(ctx: Any) -> str:
        await asyncio.sleep(1)
        return "ok"

    engine = make_engine({"nap": nap}, _flow("nap"))
    await engine.open()
    run_id = await engine.start("flow")
    while [t["status"] for t in await engine.tokens(run_id)] != ["executing"]:
        await asyncio.sleep(0.01)
    with pytest.warns(
        DeprecationWarning, match=r"Engine.close\(drain_s=…\) is deprecated; pass drain="
    ):
        await engine.close(drain_s=2)
    again = make_engine({"nap": nap}, _flow("nap"))
    async with again:
        assert [t["status"] for t in await again.tokens(run_id)] == ["completed"]


async def test_wait_takes_a_duration_string(
    virtual_clock: VirtualClock, make_engine: Callable[..., wf.Engine]
) -> None:
    async def hang(ctx: Any) -> None:
        await asyncio.Event().wait()

    async with make_engine({"hang": hang}, _flow("hang")) as engine:
        run_id = await engine.start("flow")
        with pytest.raises(tb.DeadlineExceeded) as info:
            await engine.wait(run_id, timeout="250ms")
    assert info.value.timeout == 0.25


async def test_list_runs_takes_datetimes_and_the_ms_spelling_warns(
    virtual_clock: VirtualClock, make_engine: Callable[..., wf.Engine]
) -> None:
    """since/until are aware datetimes; since_ms=/until_ms= keep their meaning with a warning."""

    async def quick(ctx: Any) -> str:
        return "ok"

    async with make_engine({"quick": quick}, _flow("quick")) as engine:
        run_id = await engine.start("flow")
        started = (await engine.get_run(run_id))["started_at"]
        at = _clock.datetime_of_ms(started)
        assert _clock.ms_of(at) == started
        ids = [r["id"] for r in await engine.list_runs(since=at, until=at + timedelta(seconds=1))]
        assert ids == [run_id]
        assert await engine.list_runs(since=at + timedelta(milliseconds=1)) == []
        assert await engine.list_runs(until=at) == []  # until is exclusive
        with pytest.warns(DeprecationWarning) as caught:
            old = await engine.list_runs(since_ms=started, until_ms=started + 1)
        assert [r["id"] for r in old] == [run_id]
        # Each old keyword warns once, naming the public class and the new keyword (D1.12).
        assert [str(w.message).split(" (")[0] for w in caught] == [
            "Engine.list_runs(since_ms=…) is deprecated; pass since=",
            "Engine.list_runs(until_ms=…) is deprecated; pass until=",
        ]
