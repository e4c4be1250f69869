"""The immutable deadline value (DECISIONS D1).

A :class:`Deadline` is an instant on the monotonic scheduling clock (``_clock.now()``), or
*never*. It is ordered, so ``min(a, b)`` gives the binding one, and it never reports expiry
before ``now() >= when`` (D1.3).
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Final

from . import _clock
from ._durations import to_seconds
from ._errors import ConfigurationError

__all__ = ["Deadline"]

_INF: Final = math.inf


class Deadline:
    """An absolute instant by which work must be done.

    Build one with :meth:`after` (relative, counted from now) or :meth:`never`. Compare, hash
    and ``min()`` them freely. ``when`` is the instant on timebound's monotonic clock.
    """

    __slots__ = ("_when",)
    _when: float

    def __init__(self, when: float) -> None:
        if when != when:  # NaN
            raise ConfigurationError("a deadline instant must not be NaN", option="when")
        object.__setattr__(self, "_when", float(when))

    # Construction -----------------------------------------------------------------------

    @classmethod
    def after(cls, seconds: float | timedelta | str) -> Deadline:
        """The deadline ``seconds`` from now. ``math.inf`` gives :meth:`never`."""
        return cls(_clock.now() + to_seconds(seconds, option="seconds"))

    @classmethod
    def never(cls) -> Deadline:
        """The deadline that is never reached."""
        return _NEVER

    # Queries ----------------------------------------------------------------------------

    @property
    def when(self) -> float:
        """The instant on timebound's monotonic clock (``math.inf`` for never)."""
        return self._when

    @property
    def is_never(self) -> bool:
        return self._when == _INF

    def remaining(self) -> float:
        """Seconds left, never negative; ``math.inf`` for never."""
        left = self._when - _clock.now()
        return left if left > 0.0 else 0.0

    @property
    def expired(self) -> bool:
        """True once ``now() >= when`` (never earlier, D1.3)."""
        return _clock.now() >= self._when

    def to_timeout_ms(self) -> int | None:
        """Remaining time in whole milliseconds, rounded up; ``None`` for never.

        This is the wire form (``X-YaTaxi-Client-TimeoutMs``). An expired deadline gives 0,
        which callers must never send (D4.3).
        """
        if self._when == _INF:
            return None
        left = self._when - _clock.now()
        if left <= 0:
            return 0
        return math.ceil(round(left * 1000, 6))

    # Value semantics --------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Deadline is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Deadline, (self._when,))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Deadline):
            return self._when == other._when
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._when)

    def __lt__(self, other: Deadline) -> bool:
        if isinstance(other, Deadline):
            return self._when < other._when
        return NotImplemented

    def __le__(self, other: Deadline) -> bool:
        if isinstance(other, Deadline):
            return self._when <= other._when
        return NotImplemented

    def __gt__(self, other: Deadline) -> bool:
        if isinstance(other, Deadline):
            return self._when > other._when
        return NotImplemented

    def __ge__(self, other: Deadline) -> bool:
        if isinstance(other, Deadline):
            return self._when >= other._when
        return NotImplemented

    def __repr__(self) -> str:
        if self._when == _INF:
            return "Deadline.never()"
        return f"Deadline(when={self._when:.6f}, remaining={self.remaining():.6f}s)"


_NEVER: Final = Deadline(_INF)
