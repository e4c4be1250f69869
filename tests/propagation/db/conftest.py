"""Shared helpers for the database adapter tests (real PostgreSQL and Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from timebound.propagation import RequestState, _state
from timebound.telemetry import counters


@pytest.fixture(autouse=True)
def _clean_counters() -> Iterator[None]:
    counters.reset()
    yield
    counters.reset()


@pytest.fixture
def request_state() -> Iterator[RequestState]:
    """A request being handled, as a server adapter would set it (sync tests)."""
    state = RequestState()
    token = _state._request.set(state)
    yield state
    _state._request.reset(token)


def unique(prefix: str) -> str:
    """A table or key name no other test (or run) uses."""
    return f"tb_{prefix}_{uuid.uuid4().hex[:10]}"


def in_request() -> tuple[RequestState, object]:
    """Enter a request in the current context (async tests); returns the state and its token."""
    state = RequestState()
    return state, _state._request.set(state)


def leave_request(token: object) -> None:
    _state._request.reset(token)  # type: ignore[arg-type]
