"""Deprecated: admission control is :mod:`timebound.admission` (it is not propagation).

The old names still work for one release; each use warns with a ``DeprecationWarning`` that names
the new path.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from .. import admission as _admission

if TYPE_CHECKING:  # the old names keep their types for a type checker
    pass

__all__ = list(_admission.__all__)


def __getattr__(name: str) -> object:
    if name in _admission.__all__:
        warnings.warn(
            f"timebound.propagation.admission.{name} moved to timebound.admission.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_admission, name)
    raise AttributeError(f"module 'timebound.propagation.admission' has no attribute {name!r}")
