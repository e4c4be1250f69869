"""Deprecated: admission control is :mod:`timebound.admission` (it is not propagation).

The old names still work for one release; each use warns with a ``DeprecationWarning`` that names
the new path.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from .. import admission as _admission

if TYPE_CHECKING:  # the old names keep their types for a type checker
    from ..admission import Admission as Admission
    from ..admission import AdmissionConfig as AdmissionConfig
    from ..admission import AdmissionStats as AdmissionStats
    from ..admission import AIMDLimit as AIMDLimit
    from ..admission import FixedLimit as FixedLimit
    from ..admission import Limit as Limit
    from ..admission import RouteEstimates as RouteEstimates
    from ..admission import Ticket as Ticket
    from ..admission import Verdict as Outcome
    from ..admission import Verdict as Verdict

__all__ = [*_admission.__all__, "Outcome"]


def __getattr__(name: str) -> object:
    if name == "Outcome":
        warnings.warn(
            "timebound.propagation.admission.Outcome is now timebound.admission.Verdict",
            DeprecationWarning,
            stacklevel=2,
        )
        return _admission.Verdict
    if name in _admission.__all__:
        warnings.warn(
            f"timebound.propagation.admission.{name} moved to timebound.admission.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_admission, name)
    raise AttributeError(f"module 'timebound.propagation.admission' has no attribute {name!r}")
