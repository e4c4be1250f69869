"""The host's event wire carries the one event record (D10.12), against a real ``timebound
serve`` (uvicorn): each event of ``GET /v1/runs/{id}/events`` and of its SSE stream keeps its
stored fields and adds ``name``, ``epoch_ms``, ``correlation`` and ``bound``, field by field what
the host's in-process listener heard; the client turns one back into that
``timebound.telemetry.Event``."""

from __future__ import annotations

import base64
import json
import pickle
import time
from pathlib import Path
from typing import Any

from timebound.host import Client, telemetry_event
from timebound.telemetry import Event

from .conftest import launch, stop

_ADDED = ("name", "epoch_ms", "correlation", "bound")


def _sse_data(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in lines:
            out.append(json.loads(lines["data"]))
    return out


def _heard(log: Path, run_id: str, count: int) -> list[Event]:
    """The events the host's listener heard of ``run_id`` (it hears a commit a moment after the
    run's end is readable, D10.3: waited for, up to 10 s)."""
    for _ in range(200):
        lines = log.read_bytes().splitlines() if log.exists() else []
        events = [pickle.loads(base64.b64decode(line)) for line in lines]
        mine = [e for e in events if e.correlation.get("run") == run_id]
        if len(mine) >= count:
            return mine
        time.sleep(0.05)
    raise AssertionError(f"the listener heard {len(mine)} of {count} events")


def _bound_agrees(wire: dict[str, Any] | None, heard: Any) -> None:
    if heard is None:
        assert wire is None
        return
    assert wire is not None
    assert {k: wire[k] for k in ("status", "code", "source", "set_by", "detail")} == {
        "status": 504,
        "code": "deadline-exceeded",
        "source": heard.source,
        "set_by": heard.set_by,
        "detail": heard.args[0],
    }
    assert wire["timeout_ms"] == heard.timeout * 1000.0
    # Whole epoch ms rounded up from the monotonic instant (D1.10): within one ms of the heard
    # deadline, never before it.
    assert 0 <= wire["deadline_epoch_ms"] - heard.deadline.to_epoch_ms() + 1 <= 2
    breakdown = heard.breakdown
    assert wire["breakdown"] == (None if breakdown is None else breakdown.to_dict())


def test_sse_get_and_the_listener_agree_field_by_field(tmp_path: Path) -> None:
    """A run whose node bound fires: each event streamed live, each read back with GET and each
    the listener heard agree on name, epoch instant, correlation, data and bound; the old
    fields are all still there."""
    log = tmp_path / "heard.log"
    server = launch(tmp_path, env={"TB_TEST_EVENT_LOG": str(log)})
    try:
        run_id = server.start("bounded", {"sleep_s": 30})
        headers = {"Accept": "text/event-stream"}
        with server.client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as r:
            live = _sse_data("".join(r.iter_text()))
        read = server.client.get(f"/v1/runs/{run_id}/events").json()["events"]
        with Client(server.url) as client:
            typed = client.events(run_id)
            followed = list(client.follow(run_id))
        heard = _heard(log, run_id, len(read))
    finally:
        stop(server)
    assert len(live) == len(read) == len(heard) == len(typed) == len(followed)
    assert "workflow.token_timed_out" in [e.name for e in heard]
    for sent, got, event in zip(live, read, heard, strict=True):
        assert {k: v for k, v in sent.items() if k != "bound"} == {
            k: v for k, v in got.items() if k != "bound"
        }
        assert got["name"] == event.name == f"workflow.{got['kind']}"
        assert got["epoch_ms"] == event.epoch_ms == got["at_epoch_ms"]
        assert got["correlation"] == dict(event.correlation)
        # The stored row's fields, as an old client reads them: unchanged.
        stored = {k: v for k, v in got.items() if k not in _ADDED}
        assert stored == {"kind": got["kind"], "at_epoch_ms": event.epoch_ms, **event.attrs}
        _bound_agrees(sent["bound"], event.bound)
        _bound_agrees(got["bound"], event.bound)
    for wire in (typed, followed):
        for i, (one, event) in enumerate(zip(wire, heard, strict=True), start=1):
            assert (one["seq"], one["kind"]) == (i, event.name.removeprefix("workflow."))
            assert one["data"] == {"at_epoch_ms": event.epoch_ms, **event.attrs}
            back = telemetry_event(one)
            assert (back.name, back.epoch_ms, dict(back.attrs), dict(back.correlation)) == (
                event.name,
                event.epoch_ms,
                dict(event.attrs),
                dict(event.correlation),
            )
            if event.bound is None:
                assert back.bound is None
            else:
                assert back.bound is not None
                assert (back.bound.source, back.bound.timeout, back.bound.set_by) == (
                    event.bound.source,
                    event.bound.timeout,
                    event.bound.set_by,
                )
                assert str(back.bound) == str(event.bound)
                assert abs(back.bound.deadline.when - event.bound.deadline.when) < 0.002
