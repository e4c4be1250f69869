"""Shared fixtures: real PostgreSQL and Redis when reachable.

Where a server is absent the tests that need it skip with a clear reason — except under
``CI=true``, where a missing service fails the run so it is never hidden.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

import timebound as tb
from timebound._core import _clock, _scopes
from timebound.telemetry import _events, _tracing

PG_HOST, PG_PORT = "127.0.0.1", 5432
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
PG_DSN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


#: What pytest_configure changed in the environment, restored by pytest_unconfigure.
_BYTECODE_ENV: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Let the suite's child processes cache their bytecode, outside the repository.

    Hundreds of tests start Python processes (hosts, workers, the CLI, the benchmarks' smoke
    runs). Under ``PYTHONDONTWRITEBYTECODE`` (set in many shells) each compiled timebound's
    sources again, about a quarter of a process's start. The children write their bytecode under
    a directory of the session's own (``PYTHONPYCACHEPREFIX``), removed at the end: nothing is
    written into the checkout, and what the children run is the same source (Python checks each
    cached file against its source's size and modification time)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or "PYTHONPYCACHEPREFIX" in os.environ:
        return
    _BYTECODE_ENV.update(PYTHONDONTWRITEBYTECODE=os.environ.pop("PYTHONDONTWRITEBYTECODE"))
    _BYTECODE_ENV["PYTHONPYCACHEPREFIX"] = None
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="timebound-tests-pyc-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _BYTECODE_ENV:
        return
    shutil.rmtree(os.environ.pop("PYTHONPYCACHEPREFIX"), ignore_errors=True)
    for name, value in _BYTECODE_ENV.items():
        if value is not None:
            os.environ[name] = value
    _BYTECODE_ENV.clear()


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _require(name: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    reason = f"{name} is not reachable at {host}:{port}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires it (start the service before the tests)")
    pytest.skip(f"{reason}; start it to run this test")


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """DSN of the test PostgreSQL database (database ``test``, user ``postgres``)."""
    _require("PostgreSQL", PG_HOST, PG_PORT)
    return PG_DSN


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis server."""
    _require("Redis", REDIS_HOST, REDIS_PORT)
    return REDIS_URL


@pytest.fixture(autouse=True)
def _no_process_state_left_behind() -> Iterator[None]:
    """Fail the test that leaves timebound's process state changed for the tests after it.

    Each of these once leaked and broke later tests in random order: a virtual clock restored
    after its test ended (time froze for the rest of the run), a spent deadline left in the main
    thread's context by the signal tier, an alarm or SIGALRM handler left armed, a listener left
    registered, a span exporter left installed, a recursion limit left raised (a later test that
    relies on Python's default limit then passed input it must refuse). A signal mask left
    changed would keep SIGALRM from the main thread.
    """
    alarm_handler = signal.getsignal(signal.SIGALRM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    listeners = list(_events._listeners)
    tracer = _tracing._tracer
    recursion_limit = sys.getrecursionlimit()
    yield
    problems = []
    if signal.pthread_sigmask(signal.SIG_BLOCK, ()) != mask:
        problems.append("the main thread's signal mask was changed")
    if (_clock.now, _clock.sleep, _clock.wall) != (time.monotonic, time.sleep, time.time):
        problems.append("the clock is not the real clock")
    if _scopes._frame.get() is not _scopes._ROOT:
        problems.append(f"a deadline scope is still active ({tb.current_deadline()!r})")
    if signal.getsignal(signal.SIGALRM) is not alarm_handler:
        problems.append("the SIGALRM handler was changed")
    if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
        problems.append("an ITIMER_REAL alarm is still armed")
    if list(_events._listeners) != listeners:
        problems.append("telemetry listeners were added or removed")
    if _tracing._tracer is not tracer:
        problems.append("a span exporter was installed or removed")
    if sys.getrecursionlimit() != recursion_limit:
        problems.append(
            f"the recursion limit was changed ({recursion_limit} -> {sys.getrecursionlimit()})"
        )
    if problems:
        pytest.fail("the test left process state behind: " + "; ".join(problems))
