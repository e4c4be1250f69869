"""The requests adapter against a real uvicorn server (D4.3, D4.5, D4.8)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import urllib3

import timebound as tb
from timebound._core._request import _request
from timebound.propagation import RequestState
from timebound.propagation.requests import AttemptTimeout, DeadlineAdapter
from timebound.telemetry import counters
from timebound.testing import VirtualClock

from .conftest import Downstream


@pytest.fixture
def session() -> Iterator[requests.Session]:
    s = requests.Session()
    adapter = DeadlineAdapter(timeout=5)
    s.mount("http://", adapter)
    yield s
    s.close()


@pytest.fixture
def state() -> Iterator[RequestState]:
    st = RequestState()
    token = _request.set(st)
    yield st
    _request.reset(token)


def test_header_at_most_remaining(svc: tuple[Downstream, str], session: requests.Session) -> None:
    """The server sees ceil(remaining ms) <= our budget; with no deadline, the static timeout."""
    app, url = svc
    with tb.fail_after(0.4):
        session.get(f"{url}/ok")
    session.get(f"{url}/ok")
    first, second = (s.timeout_ms for s in app.seen)
    assert first is not None and 1 <= first <= 400
    assert second == 5000


def test_call_timeout_tuple_is_static_without_adapter_total(svc: tuple[Downstream, str]) -> None:
    """Without an adapter total, the larger of (connect, read) is the static timeout (D4.3)."""
    app, url = svc
    with requests.Session() as s:
        s.mount("http://", DeadlineAdapter())
        s.get(f"{url}/ok", timeout=(1.0, 2.5))
        s.get(f"{url}/ok")
    assert [x.timeout_ms for x in app.seen] == [2500, None]


def test_expired_sends_nothing(
    svc: tuple[Downstream, str], session: requests.Session, state: RequestState
) -> None:
    """No time left: DeadlineExceeded at once, no request on the wire, request marked."""
    app, url = svc
    with tb.inherit_deadline(tb.Deadline.after(0)), pytest.raises(tb.DeadlineExceeded) as info:
        session.get(f"{url}/ok")
    assert info.value.source == "inherited" and state.cancelled_by_deadline
    session.get(f"{url}/ok")
    assert len(app.seen) == 1


def test_slow_server_cut_by_deadline(
    svc: tuple[Downstream, str], session: requests.Session, state: RequestState
) -> None:
    """A stalled server is cut by our deadline (source inherited); the session still works."""
    _, url = svc
    with tb.inherit_deadline(tb.Deadline.after(0.2)), pytest.raises(tb.DeadlineExceeded) as info:
        session.get(f"{url}/slow")
    assert info.value.source == "inherited" and state.cancelled_by_deadline
    assert counters.get("cancelled-by-deadline", component="http-client") == 1
    assert session.get(f"{url}/ok").status_code == 200


def test_stream_body_bounded(svc: tuple[Downstream, str]) -> None:
    """A body stalling after its first chunk ends at the adapter's total: AttemptTimeout."""
    _, url = svc
    with requests.Session() as s:
        s.mount("http://", DeadlineAdapter(timeout=0.3))
        with pytest.raises(AttemptTimeout) as info:
            s.get(f"{url}/stream")
        assert isinstance(info.value, requests.exceptions.Timeout)
        assert s.get(f"{url}/ok").status_code == 200


def test_remote_expiry_case_1_propagated_and_connection_kept(
    svc: tuple[Downstream, str], session: requests.Session, state: RequestState
) -> None:
    """D4.5 case 1: source=propagated, request marked, and the connection is reused."""
    app, url = svc
    with tb.inherit_deadline(tb.Deadline.after(2)), pytest.raises(tb.DeadlineExceeded) as info:
        session.get(f"{url}/expired")
    assert info.value.source == "propagated" and state.cancelled_by_deadline
    session.get(f"{url}/ok")
    assert len({s.client_port for s in app.seen}) == 1


def test_remote_expiry_case_2_attempt_timeout(
    svc: tuple[Downstream, str], session: requests.Session, state: RequestState
) -> None:
    """D4.5 case 2: the static timeout was used, so AttemptTimeout(remote=True), not marked."""
    _, url = svc
    with pytest.raises(AttemptTimeout) as info:
        session.get(f"{url}/expired")
    assert info.value.remote and info.value.source == "attempt"
    assert not state.cancelled_by_deadline


def test_call_timeout_number_is_static(svc: tuple[Downstream, str]) -> None:
    """A plain number as the call's ``timeout=`` is the static timeout sent on the wire."""
    app, url = svc
    with requests.Session() as s:
        s.mount("http://", DeadlineAdapter())
        s.get(f"{url}/ok", timeout=1.5)
    assert [x.timeout_ms for x in app.seen] == [1500]


def test_urllib3_timeout_total_caps_each_phase(svc: tuple[Downstream, str]) -> None:
    """A urllib3 ``Timeout``'s total caps its phases; an unset phase is not a bound of its own."""
    app, url = svc
    with requests.Session() as s:
        s.mount("http://", DeadlineAdapter())
        # requests accepts urllib3's Timeout at run time; its stubs do not say so.
        for t in (
            urllib3.Timeout(connect=1, read=3, total=2),
            urllib3.Timeout(read=4),
            urllib3.Timeout(total=0.5),
        ):
            s.get(f"{url}/ok", timeout=t)  # type: ignore[arg-type]
    assert [x.timeout_ms for x in app.seen] == [2000, 4000, 500]


def test_own_read_timeout_inside_the_budget_stays_requests_own(
    svc: tuple[Downstream, str], state: RequestState
) -> None:
    """The call's own read timeout firing before the attempt's end is requests' ReadTimeout."""
    _, url = svc
    with requests.Session() as s:
        s.mount("http://", DeadlineAdapter(timeout=5))
        with pytest.raises(requests.exceptions.ReadTimeout) as info:
            s.get(f"{url}/slow", timeout=(5, 0.1))
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert not state.cancelled_by_deadline
    assert counters.get("cancelled-by-deadline", component="http-client") == 0


def test_raw_read_after_the_end_is_cut_and_the_connection_dropped(
    svc: tuple[Downstream, str], virtual_clock: VirtualClock
) -> None:
    """A body chunk read with ``raw.read()`` after the attempt's end raises AttemptTimeout."""
    app, url = svc
    with requests.Session() as s:
        s.mount("http://", DeadlineAdapter(timeout=5))
        response = s.get(f"{url}/stream", stream=True)
        virtual_clock.advance(5)
        with pytest.raises(AttemptTimeout) as info:
            response.raw.read(5)
        assert info.value.timeout == 5.0 and not info.value.remote
        assert s.get(f"{url}/ok").status_code == 200
    # The half-read connection was closed, not put back: the next request came on a new one.
    assert len({x.client_port for x in app.seen}) == 2


def test_raw_read_of_a_stalled_body_is_cut_by_the_deadline(
    svc: tuple[Downstream, str], session: requests.Session, state: RequestState
) -> None:
    """``raw.read()`` of a body stalled after its first chunk ends at our deadline (inherited)."""
    _, url = svc
    # The budget also covers connecting and the response head, which must arrive before the
    # deadline for ``raw.read()`` to be what it cuts: 1 s leaves room for a loaded machine
    # (0.2 s did not: the cut then came in ``session.get``, outside ``pytest.raises``).
    with tb.inherit_deadline(tb.Deadline.after(1.0)):
        response = session.get(f"{url}/stream", stream=True)
        with pytest.raises(tb.DeadlineExceeded) as info:
            response.raw.read()
    assert info.value.source == "inherited" and state.cancelled_by_deadline
    assert session.get(f"{url}/ok").status_code == 200
