"""Answering "Deadline expired" is logged once, quietly: one rate-limited INFO line from
timebound with the path and the budget, and no ERROR traceback from Flask (real Flask under
werkzeug) for a view that ran out of its deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound.propagation import RequestState
from timebound.propagation.asgi import DeadlineMiddleware as AsgiMiddleware
from timebound.propagation.http._server import ExpiredAnswers
from timebound.propagation.wsgi import DeadlineMiddleware
from timebound.testing import VirtualClock

from .conftest import ServerThread, call_asgi
from .test_asgi import App as AsgiApp

H = "X-YaTaxi-Client-TimeoutMs"
LOGGER = "timebound.propagation"


def _flask_app(*, own_timeout_handler: bool = False) -> Any:
    from flask import Flask

    app = Flask("deadline_logging")

    @app.get("/late")
    def late() -> str:
        time.sleep(0.02)  # past the 1 ms the request came with
        tb.checkpoint()  # raises the request's own deadline
        return "never"

    @app.get("/attempt")
    def attempt() -> str:
        # Another bound's error while the request still has time: the view's own failure.
        raise tb.DeadlineExceeded(source="attempt", what="database query")

    if own_timeout_handler:

        @app.errorhandler(TimeoutError)
        def timeout(err: TimeoutError) -> tuple[str, int]:
            return "handled by the app", 504

    app.wsgi_app = DeadlineMiddleware(app.wsgi_app)  # type: ignore[method-assign]
    return app


@pytest.fixture
def flask_url() -> Iterator[str]:
    """A Flask app behind the WSGI middleware, under werkzeug."""
    with ServerThread(_flask_app(), kind="wsgi") as srv:
        yield srv.url


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= level]


def test_flask_late_view_logs_no_traceback(
    flask_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Flask view that ran out of its deadline is answered 498 with no ERROR log at all."""
    with caplog.at_level(logging.DEBUG):
        r = httpx.get(f"{flask_url}/late", headers={H: "1"})
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert _records(caplog, logging.WARNING) == []


def test_flask_late_view_is_one_info_line_with_path_and_budget(
    flask_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """timebound logs the 498 answer once at INFO, naming the path and the deadline received."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        httpx.get(f"{flask_url}/late", headers={H: "1"})
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in lines] == [logging.INFO]
    message = lines[0].getMessage()
    assert "answered 498" in message and "GET '/late'" in message and "1 ms" in message
    assert lines[0].exc_info is None


def test_flask_expired_on_arrival_is_logged_too(
    flask_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A request already expired on arrival is logged the same way (the view never runs)."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        r = httpx.get(f"{flask_url}/late", headers={H: "0"})
    assert r.status_code == 498
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "GET '/late'" in lines[0] and "0 ms" in lines[0]


def test_flask_other_bounds_error_keeps_flasks_error_handling(
    flask_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A DeadlineExceeded from another bound while the request has time stays a logged 500."""
    with caplog.at_level(logging.ERROR):
        r = httpx.get(f"{flask_url}/attempt", headers={H: "5000"})
    assert r.status_code == 500
    errors = _records(caplog, logging.ERROR)
    assert len(errors) == 1 and errors[0].exc_info is not None


def test_flask_apps_own_timeout_handler_still_handles_other_bounds() -> None:
    """An app's handler for a base class (TimeoutError) still gets errors that are not late."""
    with ServerThread(_flask_app(own_timeout_handler=True), kind="wsgi") as srv:
        r = httpx.get(f"{srv.url}/attempt", headers={H: "5000"})
        late = httpx.get(f"{srv.url}/late", headers={H: "1"})
    assert (r.status_code, r.text) == (504, "handled by the app")
    assert late.status_code == 498


def test_flask_apps_own_deadline_handler_is_left_alone() -> None:
    """An app that handles DeadlineExceeded itself keeps its handler."""
    from flask import Flask

    app = Flask("own_handler")

    @app.errorhandler(tb.DeadlineExceeded)
    def mine(err: tb.DeadlineExceeded) -> tuple[str, int]:
        return "mine", 504

    app.wsgi_app = DeadlineMiddleware(app.wsgi_app)  # type: ignore[method-assign]
    assert app.error_handler_spec[None][None][tb.DeadlineExceeded] is mine


def test_repeated_answers_are_info_once_per_interval(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Within the interval further answers are DEBUG; the next INFO line says how many."""
    answers = ExpiredAnswers(498, interval=10.0)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(3):
            answers.record(RequestState(deadline_received_ms=5), None, "GET", "/a")
        virtual_clock.advance(10.0)
        answers.record(RequestState(deadline_received_ms=5), None, "GET", "/a")
    levels = [r.levelno for r in caplog.records if r.name == LOGGER]
    assert levels == [logging.INFO, logging.DEBUG, logging.DEBUG, logging.INFO]
    assert "2 more answered so" in caplog.records[-1].getMessage()


def test_hostile_path_is_logged_escaped(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A path with control characters cannot forge log lines: it is logged as a repr."""
    answers = ExpiredAnswers(498)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        answers.record(RequestState(deadline_received_ms=1), None, "GET", "/x\nFORGED")
    message = caplog.records[0].getMessage()
    assert "\n" not in message and "\\nFORGED" in message


async def test_asgi_expired_answer_is_logged(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The ASGI middleware logs its 498 answers the same way."""
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = await call_asgi(AsgiMiddleware(AsgiApp()), {H: "0"})
    assert result.status == 498
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "answered 498" in lines[0] and "GET '/'" in lines[0]
