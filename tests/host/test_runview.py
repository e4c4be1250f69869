"""The run page's readings: durations as read, and what a running run waits for next."""

from __future__ import annotations

from timebound.host._runview import human_ms, pending
from timebound.host._timeline import attempts
from timebound.telemetry import stored_run_events


def test_durations_read_as_a_person_reads_them() -> None:
    """The one duration text (D1.14): ms under a second, seconds under a minute, then whole
    units largest first; the page and an error say the same thing."""
    assert [human_ms(v) for v in (0, 850, 4200, 5000, 184_000, 7_500_000, 90_000_000)] == [
        "0ms",
        "850ms",
        "4.2s",
        "5s",
        "3min 4s",
        "2h 5min",
        "1d 1h",
    ]
    assert human_ms(None) == ""


def _run(status: str = "running") -> dict:  # type: ignore[type-arg]
    return {"id": "r", "status": status, "timeout_at": 10_000}


def test_the_next_timer_is_the_stored_one_or_a_retry_delay_whichever_first() -> None:
    """A join's stored timer due before the run's deadline is next; a retry delay ending
    earlier still comes first; an ended run waits for nothing."""
    tokens = [
        {"id": "t1", "node_id": "fetch", "branch_index": None, "status": "executing",
         "timeout_at": 9_000},
    ]  # fmt: skip
    join = {"key": "join:r:j:g", "kind": "join", "due_ms": 5_000}
    assert pending(_run(), tokens, [], join)["next"] == {"what": "join deadline", "at_ms": 5_000}
    node = {"key": "tok:t1", "kind": "token", "due_ms": 9_000}
    assert pending(_run(), tokens, [], node)["next"]["what"] == "node fetch deadline"
    delay = [{"kind": "delay", "end_ms": None, "until_ms": 2_000, "node_id": "b",
              "branch_index": 1}]  # fmt: skip
    assert pending(_run(), tokens, delay, join)["next"] == {"what": "node b retry", "at_ms": 2_000}
    assert pending(_run("failed"), tokens, [], join) is None


def test_attempts_split_a_token_into_work_delay_and_waiting() -> None:
    """Failed attempt, retry delay, completed attempt, then waiting at the fan-in."""
    ev = [
        {"kind": "token_created", "at_epoch_ms": 0, "token_id": "t", "node_id": "b",
         "branch_index": 2},
        {"kind": "token_executing", "at_epoch_ms": 1, "token_id": "t", "attempt": 1},
        {"kind": "token_retry_scheduled", "at_epoch_ms": 5, "token_id": "t", "retry_at": 15,
         "error": "boom"},
        {"kind": "token_executing", "at_epoch_ms": 15, "token_id": "t", "attempt": 2},
        {"kind": "token_waiting_for_siblings", "at_epoch_ms": 20, "token_id": "t"},
        {"kind": "token_completed", "at_epoch_ms": 40, "token_id": "t"},
    ]  # fmt: skip
    got = [
        (s["kind"], s["start_ms"], s["end_ms"], s.get("outcome"))
        for s in attempts(stored_run_events("r", ev))
    ]
    assert got == [
        ("queued", 0, 1, None),
        ("attempt", 1, 5, "failed"),
        ("delay", 5, 15, None),
        ("attempt", 15, 20, "completed"),
        ("waiting", 20, 40, None),
    ]
    assert (
        attempts(stored_run_events("r", ev))[1]["error"] == "boom"
        and attempts(stored_run_events("r", ev))[1]["branch_index"] == 2
    )
