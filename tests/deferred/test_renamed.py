"""``deferred.Outcome`` is now ``StatusOutcome`` (admission had an ``Outcome`` too); the old name
works for one release with a warning naming the new one."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from timebound import deferred

from .conftest import operation_doc


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


async def test_the_registry_s_old_keywords_warn_naming_the_registry(
    store_url: str, clock: Any
) -> None:
    """The warnings name the public class users call, not the part of it that defines the
    method."""
    async with deferred.Registry(store_url) as reg:
        with pytest.warns(DeprecationWarning, match=r"^Registry\.register\(action_max_ttl_s="):
            await reg.register(operation_doc(), module="m", action_max_ttl_s=60)
        with pytest.warns(DeprecationWarning, match=r"^Registry\.poll_failed\(delay_s="):
            await reg.poll_failed("deferred:report.render:op1", delay_s=5, code="poll-timeout")
