"""The Deadline value, durations and errors (DECISIONS D1.2, D1.3, D2)."""

from __future__ import annotations

import math
import pickle
from datetime import timedelta

import pytest

import timebound as tb
from timebound._core._durations import format_duration, parse_duration, to_seconds
from timebound.testing import VirtualClock


def test_after_counts_from_now(virtual_clock: VirtualClock) -> None:
    """Deadline.after(5) is now + 5 on timebound's clock."""
    virtual_clock.advance(10)
    d = tb.Deadline.after(5)
    assert d.when == 15.0
    assert d.remaining() == 5.0


def test_remaining_never_negative(virtual_clock: VirtualClock) -> None:
    """remaining() clamps at zero once the deadline has passed."""
    d = tb.Deadline.after(1)
    virtual_clock.advance(3)
    assert d.remaining() == 0.0
    assert d.expired


def test_expired_exactly_at_deadline_not_before(virtual_clock: VirtualClock) -> None:
    """A deadline counts as reached only when now >= when (D1.3)."""
    d = tb.Deadline.after(1)
    virtual_clock.advance(0.999999)
    assert not d.expired
    virtual_clock.jump_to(1.0)
    assert d.expired


def test_never() -> None:
    """Deadline.never() never expires, has infinite remaining time and no wire timeout."""
    n = tb.Deadline.never()
    assert n.remaining() == math.inf
    assert not n.expired
    assert n.to_timeout_ms() is None
    assert n.is_never


def test_ordering_and_min(virtual_clock: VirtualClock) -> None:
    """Deadlines are ordered, so min() picks the binding one."""
    a, b = tb.Deadline.after(1), tb.Deadline.after(2)
    assert min(b, a, tb.Deadline.never()) is a
    assert a < b <= b and b > a >= a
    assert a == tb.Deadline(a.when) and hash(a) == hash(tb.Deadline(a.when))


def test_to_timeout_ms_rounds_up(virtual_clock: VirtualClock) -> None:
    """The wire form is whole milliseconds rounded up; exact values are not bumped."""
    assert tb.Deadline.after(0.2501).to_timeout_ms() == 251
    assert tb.Deadline.after(0.25).to_timeout_ms() == 250
    assert tb.Deadline.after(0.0000001).to_timeout_ms() == 1
    expired = tb.Deadline.after(0)
    assert expired.to_timeout_ms() == 0


def test_deadline_is_immutable_and_picklable(virtual_clock: VirtualClock) -> None:
    """A Deadline cannot be changed and survives pickling (through its epoch form, D1.10)."""
    d = tb.Deadline.after(3)
    with pytest.raises(AttributeError):
        d._when = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(d)) == d


def test_after_rejects_bad_input() -> None:
    """NaN, too large and malformed durations raise ConfigurationError naming the option."""
    for bad in (math.nan, 10**400, "5 s", "1.5s", "5", "ms", True):
        with pytest.raises(tb.ConfigurationError) as info:
            tb.Deadline.after(bad)  # type: ignore[arg-type]
        assert info.value.option == "seconds"
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5.0), ("2min", 120.0), ("1h", 3600.0), ("1d", 86400.0), ("0s", 0.0)],
)
def test_duration_strings(text: str, seconds: float) -> None:
    """Duration strings convert exactly as the Constellation syntax defines (D1.2)."""
    assert parse_duration(text) == seconds


def test_durations_accept_timedelta() -> None:
    """timedelta and numbers are accepted wherever durations are."""
    assert to_seconds(timedelta(milliseconds=1500)) == 1.5
    assert to_seconds(3) == 3.0


def test_zero_rejected_when_not_allowed() -> None:
    """Options that must be positive reject zero with the option named."""
    with pytest.raises(tb.ConfigurationError, match="timeout must be > 0"):
        to_seconds(0, option="timeout", allow_zero=False)


def test_format_duration() -> None:
    """Durations render the way people read them."""
    assert format_duration(0.25) == "250ms"
    assert format_duration(5) == "5s"
    assert format_duration(120) == "2min"
    assert format_duration(math.inf) == "never"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.0005, "0.5ms"),
        (0.9999996, "1s"),
        (1.5, "1.5s"),
        (59.999, "59.999s"),
        (60, "1min"),
        (90, "1min 30s"),
        (184, "3min 4s"),
        (3600, "1h"),
        (7500, "2h 5min"),
        (90_000, "1d 1h"),
        (3723.5, "1h 2min 3.5s"),
        (-0.25, "-250ms"),
    ],
)
def test_one_duration_text(seconds: float, text: str) -> None:
    """D1.14: one text for a duration everywhere; a whole value parses back as itself."""
    assert format_duration(seconds) == text
    if " " not in text and "." not in text and text[0].isdigit():
        assert parse_duration(text) == pytest.approx(seconds, abs=5e-4)


def test_an_error_and_a_policy_message_say_120s_the_same_way() -> None:
    """The error tree's message uses the same text as every other rendering (D1.14)."""
    err = tb.DeadlineExceeded(source="scope", timeout=120, what="fetch")
    assert str(err) == f"fetch timed out after {format_duration(120)} (scope deadline)"
    assert "2min" in str(err)


def test_deadline_exceeded_is_timeout_error_and_pickles() -> None:
    """DeadlineExceeded is a TimeoutError with fields that survive pickling (D2.1, D2.4)."""
    err = tb.DeadlineExceeded(source="attempt", timeout=10.0, what="GetUser")
    assert isinstance(err, TimeoutError) and isinstance(err, tb.TimeboundError)
    assert str(err) == "GetUser timed out after 10s (attempt deadline)"
    back = pickle.loads(pickle.dumps(err))
    assert (back.source, back.timeout, str(back)) == ("attempt", 10.0, str(err))


def test_deadline_exceeded_rejects_unknown_source() -> None:
    """An unknown source is a programming error, not a silent typo."""
    with pytest.raises(ValueError, match="unknown deadline source"):
        tb.DeadlineExceeded(source="nope")


def test_retry_exhausted_message_and_pickle() -> None:
    """RetryExhausted says 'failed after N attempts' with one line per attempt (D3.1)."""
    err = tb.RetryExhausted([ValueError("a"), tb.DeadlineExceeded(source="attempt", timeout=1)])
    assert err.attempts == 2
    assert "failed after 2 attempts" in str(err)
    assert "attempt 1: ValueError: a" in str(err)
    assert "attempt 2: DeadlineExceeded" in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert back.attempts == 2 and str(back) == str(err)


def test_configuration_error_pickles() -> None:
    """ConfigurationError keeps its option through pickling."""
    err = tb.ConfigurationError("bad", option="retry")
    back = pickle.loads(pickle.dumps(err))
    assert back.option == "retry" and str(back) == "bad"


def test_errors_keep_attached_attributes_through_pickle(virtual_clock: VirtualClock) -> None:
    """Attributes an engine attaches (a call site) survive pickling; live scope links do not."""
    with tb.move_on_after(1):
        virtual_clock.advance(1)
        try:
            tb.checkpoint()
        except tb.DeadlineExceeded as caught:
            err = caught
    err.call_site = ("prog.cst", 2, 5)  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(err))
    assert back.call_site == ("prog.cst", 2, 5)
    assert not hasattr(back, "_timebound_binder")
    retry = tb.RetryExhausted([ValueError("x")])
    retry.call_site = "here"  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(retry)).call_site == "here"


@pytest.mark.parametrize("text", ["\u0665s", "\uff15s", "1\u0660ms", "\uff15min"])
def test_duration_rejects_non_ascii_digits(text: str) -> None:
    """Arabic-Indic or full-width digits are a ConfigurationError naming the characters."""
    with pytest.raises(tb.ConfigurationError, match="only ASCII digits") as info:
        tb.fail_after(text)
    assert info.value.option == "seconds"


def test_duration_rejects_a_non_ascii_unit() -> None:
    """A look-alike unit character is rejected like a foreign digit."""
    with pytest.raises(tb.ConfigurationError, match="only ASCII"):
        parse_duration("5\uff53")


@pytest.mark.parametrize(
    ("text", "digits"), [("9" * 400 + "s", 400), ("9" * 5000 + "ms", 5000), ("9" * 310 + "d", 310)]
)
def test_huge_duration_is_a_configuration_error(text: str, digits: int) -> None:
    """A duration too large for a float is a ConfigurationError naming the option and the value
    (shortened), not an OverflowError or int()'s digit-limit ValueError."""
    with pytest.raises(tb.ConfigurationError, match="too large to represent") as info:
        tb.fail_after(text)
    assert info.value.option == "seconds"
    message = str(info.value)
    assert f"{digits} digits" in message and f"({len(text)} characters)" in message
    assert len(message) < 300


def test_largest_representable_duration_still_parses() -> None:
    """Leading zeros do not count, and a huge value that fits a float is still a duration."""
    assert parse_duration("0" * 400 + "5s") == 5.0
    assert parse_duration("1" + "0" * 300 + "ms") == 1e297


def test_fast_deadline_exceeded_equals_the_constructed_one() -> None:
    """The scopes' fast error has the message, fields and pickling of the normal constructor."""
    from timebound._core._errors import new_deadline_exceeded

    fast = new_deadline_exceeded("scope deadline of 1s exceeded", "scope", 1.0, None)
    slow = tb.DeadlineExceeded("scope deadline of 1s exceeded", source="scope", timeout=1.0)
    for err in (fast, pickle.loads(pickle.dumps(fast))):
        assert (str(err), err.args, err.source, err.timeout, err.deadline) == (
            str(slow),
            slow.args,
            slow.source,
            slow.timeout,
            slow.deadline,
        )
        assert isinstance(err, TimeoutError)
