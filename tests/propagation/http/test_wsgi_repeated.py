"""Repeated deadline headers under WSGI: the minimum wins, as under ASGI (D4.1)."""

from __future__ import annotations

import timebound as tb
from timebound.propagation.wsgi import DeadlineMiddleware
from timebound.testing import VirtualClock

from .test_wsgi import KEY, App, call


def test_comma_joined_repeats_take_the_minimum(virtual_clock: VirtualClock) -> None:
    """A server that joined two header lines into '300, 120' gives the app 120 ms."""
    app = App()
    status, _, _ = call(DeadlineMiddleware(app), {KEY: "300, 120"})
    assert status.startswith("200")
    assert app.deadline == tb.Deadline(0.12)


def test_invalid_part_is_ignored_valid_part_kept(virtual_clock: VirtualClock) -> None:
    """One malformed repeat does not discard a valid one (parsing never raises)."""
    app = App()
    call(DeadlineMiddleware(app), {KEY: "abc,250"})
    assert app.deadline == tb.Deadline(0.25)


def test_expired_repeat_answers_expired(virtual_clock: VirtualClock) -> None:
    """A repeated value of 0 means already expired: 498 and the app is not called."""
    app = App()
    status, headers, body = call(DeadlineMiddleware(app), {KEY: "500,0"})
    assert status.startswith("498")
    assert body == b"Deadline expired"
    assert headers["x-yataxi-deadline-expired"] == "1"
    assert app.calls == 0
