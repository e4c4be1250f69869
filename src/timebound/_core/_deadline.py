"""The immutable deadline value (DECISIONS D1).

A :class:`Deadline` is an instant on the monotonic scheduling clock (``_clock.now()``), or
*never*. It is ordered, so ``min(a, b)`` gives the binding one, and it never reports expiry
before ``now() >= when`` (D1.3).

A monotonic instant means nothing in another process or after a restart, so the durable form is
an absolute UTC instant in epoch milliseconds (D1.10): :meth:`Deadline.to_epoch_ms` and
:meth:`Deadline.from_epoch_ms` convert at the boundary, and pickling goes through that form.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Final

from . import _clock
from ._durations import ceil_ms, to_seconds
from ._errors import ConfigurationError

__all__ = ["Deadline", "instant_epoch_ms"]

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
        """The deadline ``seconds`` from now. ``math.inf`` gives :meth:`never`.

        A negative ``seconds`` gives a deadline that has already passed: now (D1.9).
        """
        return cls(_clock.now() + to_seconds(seconds, option="seconds", negative_is_zero=True))

    @classmethod
    def _at(cls, when: float) -> Deadline:
        """A deadline at ``when``, a float already known not to be NaN (the scopes' fast path)."""
        d = object.__new__(cls)
        object.__setattr__(d, "_when", when)
        return d

    @classmethod
    def never(cls) -> Deadline:
        """The deadline that is never reached."""
        return _NEVER

    @classmethod
    def from_epoch_ms(cls, epoch_ms: int | None) -> Deadline:
        """The deadline at the absolute UTC instant ``epoch_ms`` (the durable form, D1.10).

        The instant is converted to the local monotonic clock *now*, by the local wall clock:
        what was left on the machine that wrote it is left here, give or take the skew between
        the two wall clocks. Later wall-clock steps (an NTP correction) no longer move it.
        ``None`` is :meth:`never`, as :meth:`to_epoch_ms` writes it.
        """
        if epoch_ms is None:
            return _NEVER
        if isinstance(epoch_ms, bool) or not isinstance(epoch_ms, int):
            raise ConfigurationError(
                f"Deadline.from_epoch_ms() takes whole epoch milliseconds (an int) or None, "
                f"not {type(epoch_ms).__name__}",
                option="epoch_ms",
            )
        try:
            left = epoch_ms / 1000 - _clock.wall()
        except OverflowError:
            raise ConfigurationError(
                f"Deadline.from_epoch_ms(): {epoch_ms} is too large for an instant",
                option="epoch_ms",
            ) from None
        return cls(_clock.now() + left)

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
        return ceil_ms(left)

    def to_epoch_ms(self) -> int | None:
        """The durable form: this instant as whole UTC epoch milliseconds; ``None`` for never.

        Read through the local wall clock, and rounded **up**, so a deadline stored and loaded
        again (here or elsewhere, :meth:`from_epoch_ms`) is never earlier than this one (D1.3,
        D1.10). Use it for anything that outlives the process or crosses machines.
        """
        if self._when == _INF:
            return None
        epoch_ms = (_clock.wall() + (self._when - _clock.now())) * 1000
        # round() first: float noise (e.g. 1234.0000001) must not bump an exact value.
        return math.ceil(round(epoch_ms, 3))

    # Value semantics --------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Deadline is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # A monotonic instant is meaningless in another process (D1.10): pickle the epoch form.
        return (Deadline.from_epoch_ms, (self.to_epoch_ms(),))

    def __copy__(self) -> Deadline:
        return self  # immutable; a copy through the epoch form would round the instant

    def __deepcopy__(self, memo: dict[int, Any]) -> Deadline:
        return self

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


def instant_epoch_ms(value: object, *, option: str) -> int | None:
    """An instant a caller names, as whole UTC epoch milliseconds rounded **up** (D1.13): a
    :class:`Deadline` (``None`` for never) or an aware ``datetime``. Anything else, a naive
    ``datetime`` included, is a :class:`ConfigurationError` naming ``option``."""
    if isinstance(value, Deadline):
        return value.to_epoch_ms()
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigurationError(
                f"{option}=datetime must be aware (e.g. tzinfo=UTC): a naive datetime names no "
                "instant",
                option=option,
            )
        return math.ceil(round(value.timestamp() * 1000, 3))
    raise ConfigurationError(
        f"{option} takes a timebound.Deadline or an aware datetime, not {type(value).__name__}",
        option=option,
    )
