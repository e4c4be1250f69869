"""``timebound.propagation.admission`` still works for one release, and says where to go."""

from __future__ import annotations

import pytest

import timebound.admission as admission
import timebound.propagation.admission as old


@pytest.mark.parametrize("name", admission.__all__)
def test_each_old_name_warns_and_is_the_new_object(name: str) -> None:
    """Every name of the old module is the new module's, with a warning naming the new path."""
    with pytest.warns(DeprecationWarning, match=rf"timebound\.admission\.{name}\b"):
        value = getattr(old, name)
    assert value is getattr(admission, name)


def test_from_import_warns() -> None:
    """``from timebound.propagation.admission import Admission`` warns too."""
    with pytest.warns(DeprecationWarning, match="moved to timebound.admission.Admission"):
        from timebound.propagation.admission import Admission
    assert Admission is admission.Admission


def test_outcome_is_now_verdict() -> None:
    """The old ``Outcome`` (a name deferred had too) is ``timebound.admission.Verdict``."""
    with pytest.warns(DeprecationWarning, match=r"Outcome is now timebound\.admission\.Verdict"):
        value = old.Outcome
    assert value is admission.Verdict
    assert not hasattr(admission, "Outcome")


def test_an_unknown_name_is_an_attribute_error() -> None:
    """A name the module never had is an AttributeError naming it, with no warning."""
    with pytest.raises(AttributeError, match="'Nope'"):
        old.Nope  # noqa: B018
