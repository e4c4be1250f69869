"""Old keyword spellings kept for one release (D1.12): they warn, name the new keyword, convert
their value, and never hide in the public signature."""

from __future__ import annotations

import inspect
import warnings
from datetime import timedelta

import pytest

import timebound as tb
from timebound._core._durations import Duration, to_ms, to_seconds
from timebound._core._renamed import Renamed, from_ms, renamed
from timebound.testing import VirtualClock


@renamed(span_ms=Renamed("span", from_ms), pause_s=Renamed("pause"))
def _configure(*, span: Duration = 1.0, pause: Duration = 0.0) -> tuple[float, float]:
    return to_seconds(span, option="span"), to_seconds(pause, option="pause")


@renamed(span_ms=Renamed("span", from_ms))
async def _aconfigure(*, span: Duration = 1.0) -> float:
    return to_seconds(span, option="span")


def test_the_new_spelling_takes_every_duration_form_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _configure(span="250ms", pause=timedelta(seconds=2)) == (0.25, 2.0)


def test_an_old_spelling_warns_naming_the_new_one_and_converts_its_unit() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"_configure\(span_ms=…\) is deprecated; pass span="
    ):
        assert _configure(span_ms=250) == (0.25, 0.0)
    with pytest.warns(DeprecationWarning, match="pass pause="):
        assert _configure(pause_s=3) == (1.0, 3.0)


def test_the_warning_points_at_the_caller() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        _configure(span_ms=1)
    assert caught[0].filename == __file__


async def test_a_coroutine_keeps_its_old_spelling_too(virtual_clock: VirtualClock) -> None:
    assert inspect.iscoroutinefunction(_aconfigure)
    with pytest.warns(DeprecationWarning, match="pass span="):
        assert await _aconfigure(span_ms=1500) == 1.5


def test_both_spellings_at_once_are_refused_naming_both() -> None:
    with pytest.raises(tb.ConfigurationError, match=r"both span_ms= and span=") as info:
        _configure(span="1s", span_ms=1000)
    assert info.value.option == "span"


def test_the_signature_shows_only_the_new_names() -> None:
    assert list(inspect.signature(_configure).parameters) == ["span", "pause"]
    assert set(_configure.__renamed__) == {"span_ms", "pause_s"}  # type: ignore[attr-defined]


def test_an_old_ms_value_of_the_wrong_type_is_named_by_the_new_keyword() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(tb.ConfigurationError, match="span"):
        _configure(span_ms=[1])


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (0.3, 300),
        ("250ms", 250),
        (timedelta(milliseconds=1), 1),
        (0.0001, 1),
        (0, 0),
        (1.0005, 1001),
    ],
)
def test_to_ms_rounds_up_to_whole_milliseconds(value: Duration, ms: int) -> None:
    """A stored span is never shorter than asked (D1.3); 0.3 s is 300 ms, not 301."""
    assert to_ms(value) == ms


def test_to_ms_refuses_no_bound_and_zero_when_asked() -> None:
    with pytest.raises(tb.ConfigurationError, match="lease must be a finite duration"):
        to_ms(float("inf"), option="lease")
    with pytest.raises(tb.ConfigurationError, match="lease must be > 0"):
        to_ms(0, option="lease", allow_zero=False)
