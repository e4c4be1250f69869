"""The core stands alone: dependencies point down, one registry of detached tasks."""

from __future__ import annotations

import ast
import asyncio
import gc
import re
from pathlib import Path

import timebound as tb
from timebound._core import _preempt, _scopes
from timebound.telemetry import _events
from timebound.testing import VirtualClock

CORE = Path(_scopes.__file__).parent


def _core_sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(CORE.glob("*.py"))}


def test_core_imports_nothing_above_it() -> None:
    """No module of _core imports another timebound package (only its siblings)."""
    for name, text in _core_sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                raise AssertionError(f"_core/{name} imports from above: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                assert not any(n.startswith("timebound") for n in names), (name, names)


def test_core_does_not_reach_into_timebound_through_sys_modules() -> None:
    """_core never looks up a timebound module by name at run time (telemetry hooks in)."""
    for name, text in _core_sources().items():
        assert re.search(r"sys\.modules\W[^\n]*timebound", text) is None, name


def test_telemetry_counts_abandoned_threads_through_the_core_hook() -> None:
    """Telemetry registers its abandoned-thread hook with the core when it loads."""
    assert _events._thread_abandoned in _preempt.abandon_hooks


async def test_spawn_background_task_is_held_until_it_ends(virtual_clock: VirtualClock) -> None:
    """A background task with no other reference survives garbage collection and finishes."""
    done: list[str] = []

    async def work() -> None:
        await asyncio.sleep(0)
        done.append("finished")

    tb.spawn_background(work())
    gc.collect()
    for _ in range(3):
        await asyncio.sleep(0)
    assert done == ["finished"]
    assert not _scopes._background


async def test_detached_task_sees_no_deadline(virtual_clock: VirtualClock) -> None:
    """A detached task starts from a clean context: no enclosing deadline shows through."""
    seen: list[bool] = []

    async def work() -> None:
        seen.append(tb.current_deadline().is_never)

    async with tb.fail_after(10):
        task = _scopes._spawn_detached(work(), eager=True)
    await task
    assert seen == [True]


def test_finished_tasks_leave_at_most_the_scope_itself_to_the_cyclic_gc() -> None:
    """Tasks whose scopes exited leave one cyclic object each (the scope), not their task."""

    async def work() -> None:
        async with tb.fail_after(10):
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*[work() for _ in range(200)])

    gc.collect()
    gc.disable()
    try:
        asyncio.run(main())
        garbage = gc.collect()
    finally:
        gc.enable()
    assert garbage <= 200 + 50  # one scope per task; a little of asyncio.run's own
