"""``on_error: wrap`` results (DECISIONS D3.5): a call returns ``Ok(value)`` or ``Err(error)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, NoReturn, TypeVar

__all__ = ["Err", "Ok", "Result"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Ok(Generic[_T]):
    """A successful call under ``on_error="wrap"``; ``value`` is what the call returned."""

    value: _T

    @property
    def ok(self) -> Literal[True]:
        """Always ``True`` (``Err.ok`` is ``False``), so ``if result.ok:`` reads naturally."""
        return True

    def unwrap(self) -> _T:
        """The value."""
        return self.value


@dataclass(frozen=True, slots=True)
class Err:
    """A failed call under ``on_error="wrap"``; ``error`` is the exception the call ended with."""

    error: BaseException

    @property
    def ok(self) -> Literal[False]:
        """Always ``False``."""
        return False

    def unwrap(self) -> NoReturn:
        """Raise the wrapped error."""
        raise self.error


#: What a call under ``on_error="wrap"`` returns.
Result = Ok[_T] | Err
