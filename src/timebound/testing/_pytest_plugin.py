"""pytest plugin: the ``virtual_clock`` fixture, and ``async def`` tests run on virtual time.

An ``async def`` test that requests ``virtual_clock`` runs on that clock's event loop. Other
``async def`` tests marked ``@pytest.mark.asyncio_real`` run on a real asyncio loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
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
