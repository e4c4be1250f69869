"""``deferred.Outcome`` is now ``StatusOutcome`` (admission had an ``Outcome`` too); the old name
works for one release with a warning naming the new one."""

from __future__ import annotations

import warnings

import pytest

from timebound import deferred


def test_outcome_warns_and_is_status_outcome() -> None:
    """``deferred.Outcome`` is ``deferred.StatusOutcome``, with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match=r"timebound\.deferred\.StatusOutcome"):
        value = deferred.Outcome  # type: ignore[attr-defined]
    assert value is deferred.StatusOutcome


def test_the_new_name_does_not_warn() -> None:
    """``StatusOutcome`` is the API: using it warns about nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert deferred.StatusOutcome(True, None).applied is True
    with pytest.raises(AttributeError, match="'Nope'"):
        deferred.Nope  # type: ignore[attr-defined]  # noqa: B018
