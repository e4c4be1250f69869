"""pytest plugin: the ``virtual_clock`` fixture, and ``async def`` tests run on virtual time.

An ``async def`` test that requests ``virtual_clock`` runs on that clock's event loop. Other
``async def`` tests marked ``@pytest.mark.asyncio_real`` run on a real asyncio loop. A test that
pytest-asyncio runs (``@pytest.mark.asyncio``, or ``asyncio_mode = auto``) stays on
pytest-asyncio's loop, and that loop runs on the virtual clock for the duration of the test.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from ._virtual import VirtualClock


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "asyncio_real: run this async test on a real asyncio event loop"
    )


@pytest.fixture
def virtual_clock() -> Iterator[VirtualClock]:
    """A :class:`VirtualClock` at t=0, installed for the test; async tests run on its loop."""
    clock = VirtualClock(0.0)
    with clock:
        yield clock


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    func = pyfuncitem.obj
    if not inspect.iscoroutinefunction(func):
        return None
    funcargs = pyfuncitem.funcargs
    kwargs: dict[str, Any] = {
        name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames if name in funcargs
    }
    clock = funcargs.get("virtual_clock")
    if isinstance(clock, VirtualClock):
        clock.run(func(**kwargs))
        return True
    if pyfuncitem.get_closest_marker("asyncio_real") is not None:
        asyncio.run(func(**kwargs))
        return True
    return None


@pytest.hookimpl(wrapper=True, specname="pytest_pyfunc_call")
def pytest_pyfunc_call_on_virtual_time(
    pyfuncitem: pytest.Function,
) -> Generator[None, object, object]:
    """A pytest-asyncio test with ``virtual_clock``: its loop runs on the clock meanwhile.

    pytest-asyncio has already made the test's loop (its runner's, the thread's current loop)
    and hands the test a synchronous wrapper, so the hook above leaves it alone. Without this,
    the test would run on real time while timebound reads the frozen virtual clock, and a
    ``fail_after(1)`` would never fire.
    """
    clock = pyfuncitem.funcargs.get("virtual_clock")
    if (
        not isinstance(clock, VirtualClock)
        or pyfuncitem.get_closest_marker("asyncio") is None
        # pytest-asyncio's wrapper keeps the test function as __wrapped__; a sync test that
        # merely carries the mark has no loop to drive.
        or not inspect.iscoroutinefunction(inspect.unwrap(pyfuncitem.obj))
    ):
        return (yield)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "no current event loop"
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            loop = None
    if loop is None or getattr(loop, "_selector", None) is None:
        pytest.fail(
            f"virtual_clock can only drive an asyncio selector event loop, and pytest-asyncio "
            f"gave this test a {type(loop).__name__}: run it on the default asyncio loop (no "
            f"custom loop factory or policy such as uvloop for tests that use virtual_clock)",
            pytrace=False,
        )
    with clock.drive(loop):
        return (yield)
