"""Old keyword spellings kept for one release (D1.12): ``lease_ms=30_000`` still works, warns
with a :class:`DeprecationWarning` that names the new keyword, and reaches the function as
``lease=30.0``. The public signature (what ``inspect.signature`` and the docs show) has only the
new names; the old ones are recorded on the function as ``__renamed__`` for the surface test.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, ParamSpec, TypeVar

from ._errors import ConfigurationError

__all__ = ["Renamed", "from_ms", "renamed", "same"]

P = ParamSpec("P")
R = TypeVar("R")


def same(value: Any) -> Any:
    """The old keyword took the value in the new one's unit already (seconds)."""
    return value


def from_ms(value: Any) -> Any:
    """The old keyword took whole milliseconds; the new one takes a duration (seconds)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value / 1000
    return value  # let the new keyword's own check name what is wrong


#: What the warning says the new keyword takes, unless the rename says otherwise.
DURATION_HINT = "a duration such as '250ms', seconds or a timedelta"


class Renamed(NamedTuple):
    """An old keyword: the new keyword it became, how its value converts, and what the warning
    says the new keyword takes (``hint``)."""

    new: str
    convert: Callable[[Any], Any] = same
    hint: str = DURATION_HINT


def renamed(**old: Renamed) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Accept each old keyword in ``old`` for the new one it names, with a DeprecationWarning.

    Passing both spellings at once is a :class:`ConfigurationError` naming both.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        owner = func.__qualname__.removesuffix(".__init__")

        def translate(kwargs: dict[str, Any]) -> None:
            for name, spec in old.items():
                if name not in kwargs:
                    continue
                value = kwargs.pop(name)
                if spec.new in kwargs:
                    raise ConfigurationError(
                        f"{owner}() got both {name}= and {spec.new}=; pass {spec.new}= only "
                        f"({name}= is its deprecated spelling)",
                        option=spec.new,
                    )
                warnings.warn(
                    f"{owner}({name}=…) is deprecated; pass {spec.new}= ({spec.hint})",
                    DeprecationWarning,
                    stacklevel=3,
                )
                kwargs[spec.new] = spec.convert(value)

        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                translate(kwargs)
                return await func(*args, **kwargs)

        else:

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                translate(kwargs)
                return func(*args, **kwargs)

        wrapper.__renamed__ = dict(old)  # type: ignore[attr-defined]
        return wrapper

    return decorate
