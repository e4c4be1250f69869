"""FastAPI ``BackgroundTasks`` run inside the request's ASGI call, so they inherit its
deadline; :func:`timebound.propagation.detached` runs them without it. Real FastAPI under
uvicorn."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import BackgroundTasks, FastAPI

import timebound as tb
from timebound.propagation import current_request, detached
from timebound.propagation.asgi import DeadlineMiddleware

from .conftest import ServerThread

H = "X-YaTaxi-Client-TimeoutMs"


@dataclass
class Outcome:
    """What a background job saw, filled in from the server's thread."""

    deadline: tb.Deadline | None = None
    in_request: bool | None = None
    error: BaseException | None = None
    finished: bool = False
    done: threading.Event = field(default_factory=threading.Event)


async def slow_job(outcome: Outcome) -> None:
    """Outlives a 50 ms request deadline, then does deadline-aware work (as a DB call would)."""
    outcome.deadline = tb.current_deadline()
    outcome.in_request = current_request() is not None
    try:
        await asyncio.sleep(0.1)
        tb.checkpoint()
        with tb.fail_after(5):
            await asyncio.sleep(0)
        outcome.finished = True
    except BaseException as exc:
        outcome.error = exc
        raise
    finally:
        outcome.done.set()


def slow_sync_job(outcome: Outcome) -> None:
    """The sync twin of :func:`slow_job` (Starlette runs it in a worker thread)."""
    outcome.deadline = tb.current_deadline()
    outcome.in_request = current_request() is not None
    try:
        time.sleep(0.1)
        tb.checkpoint()
        outcome.finished = True
    except BaseException as exc:
        outcome.error = exc
        raise
    finally:
        outcome.done.set()


def _app(job: Callable[[Outcome], Any], outcome: Outcome, *, cancel_on_expiry: bool) -> Any:
    app = FastAPI()
    app.add_middleware(DeadlineMiddleware, cancel_on_expiry=cancel_on_expiry)

    @app.post("/signup")
    async def signup(tasks: BackgroundTasks) -> dict[str, str]:
        tasks.add_task(job, outcome)
        return {"status": "ok"}

    return app


@pytest.fixture
def run() -> Iterator[Callable[..., tuple[int, Outcome]]]:
    """Serve an app whose endpoint schedules ``job``; POST once with a 50 ms deadline."""
    servers: list[ServerThread] = []

    def go(job: Callable[[Outcome], Any], *, cancel_on_expiry: bool = False) -> tuple[int, Outcome]:
        outcome = Outcome()
        srv = ServerThread(_app(job, outcome, cancel_on_expiry=cancel_on_expiry)).__enter__()
        servers.append(srv)
        status = httpx.post(f"{srv.url}/signup", headers={H: "50"}).status_code
        assert outcome.done.wait(10), "the background job never ended"
        return status, outcome

    yield go
    for srv in servers:
        srv.__exit__(None, None, None)


def test_plain_background_task_is_cut_by_the_request_deadline(
    run: Callable[..., tuple[int, Outcome]],
) -> None:
    """Without detached(), a background task runs under the request's deadline and is cut."""
    status, outcome = run(slow_job)
    assert status == 200
    assert outcome.deadline is not None and outcome.deadline != tb.Deadline.never()
    assert isinstance(outcome.error, tb.DeadlineExceeded)
    assert outcome.error.source == "inherited"


def test_detached_async_background_task_outlives_the_deadline(
    run: Callable[..., tuple[int, Outcome]],
) -> None:
    """detached() runs an async background task with no deadline and outside the request."""
    status, outcome = run(detached(slow_job))
    assert status == 200
    assert (outcome.deadline, outcome.in_request) == (tb.Deadline.never(), False)
    assert outcome.error is None and outcome.finished


def test_detached_sync_background_task_outlives_the_deadline(
    run: Callable[..., tuple[int, Outcome]],
) -> None:
    """detached() runs a sync background task (in Starlette's worker thread) without it too."""
    status, outcome = run(detached(slow_sync_job))
    assert status == 200
    assert (outcome.deadline, outcome.in_request) == (tb.Deadline.never(), False)
    assert outcome.error is None and outcome.finished


def test_detached_task_survives_cancel_on_expiry(
    run: Callable[..., tuple[int, Outcome]],
) -> None:
    """With cancel_on_expiry=True the request is cancelled at its deadline, the job is not."""
    status, outcome = run(detached(slow_job), cancel_on_expiry=True)
    assert status == 200
    assert outcome.error is None and outcome.finished


def test_detached_rejects_what_is_not_callable() -> None:
    """detached(42) says what it takes."""
    with pytest.raises(tb.ConfigurationError, match="takes the function to run"):
        detached(42)  # type: ignore[call-overload]
