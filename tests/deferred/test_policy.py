"""The host policy's formulas (D7.6, D7.8): clamps, lifetimes, additive jitter."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

import timebound as tb
from timebound.deferred import HostPolicy
from timebound.testing import VirtualClock

NOW = datetime(2026, 5, 5, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize(("hint", "expected"), [(5, 5), (1, 1), (600, 60), (60, 60)])
def test_retry_after_clamps_the_hint(hint: int, expected: int) -> None:
    """retry_after is clamp(hint, min, max)."""
    assert HostPolicy().retry_after(hint) == expected


@pytest.mark.parametrize("hint", [None, 0, -3, 2.5, "5", True, float("nan")])
def test_invalid_hints_fall_back_to_the_minimum(hint: object) -> None:
    """An absent, zero, negative, non-integer or unparsable hint: the minimum, marked invalid."""
    policy = HostPolicy(min_retry_after=3)
    assert policy.check_retry_after(hint) == (3, False)


def test_lifetime_defaults_to_max_ttl() -> None:
    """With no hint at all the lifetime is max_ttl (15 minutes by default)."""
    assert HostPolicy().expires_at(NOW) == NOW + timedelta(minutes=15)


def test_lifetime_is_the_smallest_present_hint() -> None:
    """fail_after and the action's TTL: the smaller one wins."""
    policy = HostPolicy()
    assert policy.expires_at(NOW, fail_after=600, action_max_ttl=120) == NOW + timedelta(
        seconds=120
    )


def test_a_connector_cannot_extend_past_max_ttl() -> None:
    """A connector hint of a day is clamped to max_ttl."""
    got = HostPolicy(max_ttl=300).expires_at(NOW, fail_after=86400)
    assert got == NOW + timedelta(seconds=300)


def test_the_caller_deadline_is_an_upper_bound(virtual_clock: VirtualClock) -> None:
    """A caller deadline 40 s away bounds a 600 s connector hint."""
    now = datetime.fromtimestamp(virtual_clock.wall(), tz=UTC)
    got = HostPolicy().expires_at(now, fail_after=600, caller_deadline=tb.Deadline.after(40))
    assert got == now + timedelta(seconds=40)


def test_a_spent_caller_deadline_creates_nothing(virtual_clock: VirtualClock) -> None:
    """A caller deadline already passed raises DeadlineExceeded with source deferred."""
    deadline = tb.Deadline.after(1)
    virtual_clock.advance(2)
    now = datetime.fromtimestamp(virtual_clock.wall(), tz=UTC)
    with pytest.raises(tb.DeadlineExceeded) as info:
        HostPolicy().expires_at(now, caller_deadline=deadline)
    assert info.value.source == "deferred"


def test_the_caller_deadline_may_be_an_aware_datetime() -> None:
    """An aware datetime caller deadline bounds the lifetime as a Deadline does."""
    got = HostPolicy().expires_at(NOW, fail_after=600, caller_deadline=NOW + timedelta(seconds=40))
    assert got == NOW + timedelta(seconds=40)
    other_zone = (NOW + timedelta(seconds=90)).astimezone(timezone(timedelta(hours=3)))
    assert HostPolicy().expires_at(NOW, caller_deadline=other_zone) == NOW + timedelta(seconds=90)


def test_a_passed_datetime_caller_deadline_creates_nothing() -> None:
    """A datetime caller deadline already passed raises DeadlineExceeded with source deferred."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        HostPolicy().expires_at(NOW, caller_deadline=NOW - timedelta(seconds=1))
    assert info.value.source == "deferred"


@pytest.mark.parametrize("bad", [datetime(2026, 5, 5, 18, 1), "2026-05-05T18:01:00Z", 1.5, True])
def test_an_unusable_caller_deadline_says_what_to_pass(bad: object) -> None:
    """A naive datetime, a string or a float is a ConfigurationError naming caller_deadline."""
    with pytest.raises(tb.ConfigurationError) as info:
        HostPolicy().expires_at(NOW, caller_deadline=bad)  # type: ignore[arg-type]
    assert info.value.option == "caller_deadline"


def test_jitter_is_additive_and_bounded() -> None:
    """Jitter lies in [0, min(0.2 * retry_after, 5 s)]: never negative, never above the bound."""
    policy = HostPolicy(rng=random.Random(7))
    small = [policy.jitter_s(10) for _ in range(2000)]
    large = [policy.jitter_s(60) for _ in range(2000)]
    assert min(small) >= 0 and max(small) <= 2.0
    assert min(large) >= 0 and max(large) <= 5.0
    assert max(small) > 1.5  # the spread is really used


def test_jitter_off_is_zero() -> None:
    """jitter=False adds nothing."""
    assert HostPolicy(jitter=False).jitter_s(30) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"min_retry_after": 0}, "min_retry_after"),
        ({"max_ttl": -1}, "max_ttl"),
        ({"max_ttl": "1500ms"}, "max_ttl"),
        ({"retain": "never"}, "retain"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"poll_rate_cap": 1.5}, "poll_rate_cap"),
        ({"min_retry_after": 10, "max_retry_after": 5}, "min_retry_after"),
        ({"jitter": "yes"}, "jitter"),
    ],
)
def test_bad_configuration_names_the_option(kwargs: dict[str, object], name: str) -> None:
    """A bad option raises ConfigurationError naming it."""
    with pytest.raises(tb.ConfigurationError, match=name):
        HostPolicy(**kwargs)  # type: ignore[arg-type]


def test_naive_now_is_refused() -> None:
    """expires_at takes an aware datetime."""
    with pytest.raises(tb.ConfigurationError, match="aware"):
        HostPolicy().expires_at(datetime(2026, 1, 1))


def test_spans_take_durations_and_read_back_as_whole_seconds() -> None:
    policy = HostPolicy(min_retry_after="2s", max_retry_after="5min", max_ttl=timedelta(hours=1))
    assert (policy.min_retry_after, policy.max_retry_after, policy.max_ttl) == (2, 300, 3600)
    assert policy.describe()["max_ttl_s"] == 3600  # the operator view's document keys stay


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("min_retry_after_s", "min_retry_after"),
        ("max_retry_after_s", "max_retry_after"),
        ("max_ttl_s", "max_ttl"),
        ("retain_s", "retain"),
    ],
)
def test_the_old_s_spellings_warn_naming_the_new_ones(old: str, new: str) -> None:
    """One release of grace (D1.12): the old keyword and the old attribute both still work."""
    with pytest.warns(
        DeprecationWarning, match=rf"HostPolicy\({old}=…\) is deprecated; pass {new}="
    ):
        policy = HostPolicy(**{old: 30})
    assert getattr(policy, new) == 30
    with pytest.warns(
        DeprecationWarning, match=rf"HostPolicy.{old} is deprecated; read HostPolicy.{new}"
    ):
        assert getattr(policy, old) == 30


def test_expires_at_takes_durations_and_its_old_spellings() -> None:
    got = HostPolicy().expires_at(NOW, fail_after="10min", action_max_ttl=timedelta(minutes=2))
    assert got == NOW + timedelta(seconds=120)
    with pytest.warns(DeprecationWarning, match="pass fail_after="):
        assert HostPolicy().expires_at(NOW, fail_after_s=60) == NOW + timedelta(seconds=60)
    with pytest.raises(tb.ConfigurationError, match="fail_after"):
        HostPolicy().expires_at(NOW, fail_after=float("nan"))
