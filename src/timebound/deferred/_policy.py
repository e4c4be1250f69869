"""The host policy (D7.6, D7.8): the host, not the connector, owns cadence, lifetime and load.

Every connector hint goes through here: ``retry_after`` clamps the poll interval, ``expires_at``
computes the lifetime (the connector's hint, the action's profile and the caller's deadline, the
smallest present, never above ``max_ttl``), and ``poll_delay`` adds jitter on top of the clamped
interval only, so no poll is ever earlier than the interval the host agreed to.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._core._clock import datetime_of_ms, ms_of
from .._core._deadline import Deadline, instant_epoch_ms
from .._core._durations import Duration, format_duration, to_seconds
from .._core._errors import ConfigurationError, DeadlineExceeded
from .._core._renamed import Renamed, renamed
from .._core._scopes import reserve_seconds
from ..policies._retry import RetryPlan

__all__ = ["HostPolicy"]

_rng = random.Random()


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"HostPolicy({name}=...) takes a positive integer, not {value!r}")


def _whole_seconds(name: str, value: Duration) -> int:
    """A span of the policy: a duration of whole seconds, at least one (the hints it clamps and
    the ``retry_after_seconds`` it writes are whole seconds, D7.8)."""
    seconds = to_seconds(value, option=name, allow_zero=False)
    if not seconds.is_integer():
        raise ConfigurationError(
            f"HostPolicy({name}=...) takes whole seconds (such as 1, '2min' or '1h'), "
            f"not {value!r}",
            option=name,
        )
    return int(seconds)


def _deprecated_field(new: str) -> property:
    """The old ``*_s`` attribute, read for one release with a DeprecationWarning (D1.12)."""

    def read(self: HostPolicy) -> int:
        warnings.warn(
            f"HostPolicy.{new}_s is deprecated; read HostPolicy.{new} (whole seconds)",
            DeprecationWarning,
            stacklevel=2,
        )
        value: int = getattr(self, new)
        return value

    return property(read)


@dataclass(frozen=True, init=False)
class HostPolicy:
    """The deferred-operation limits a host enforces (defaults fixed by D7.8).

    ``min_retry_after``, ``max_retry_after``, ``max_ttl`` and ``retain`` are durations of whole
    seconds (``5``, ``"2min"``, ``timedelta(hours=1)``) and read back as ``int`` seconds.
    ``reserve`` (any duration, read back as seconds, D7.16) is the time the host keeps before a
    caller's deadline to record an operation's end and resume its continuation: an operation
    bounded by its caller expires that much earlier, and a caller with no more than it left
    creates nothing.
    """

    min_retry_after: int
    max_retry_after: int
    max_ttl: int
    max_attempts: int | None
    poll_rate_cap: int
    per_module_inflight: int
    jitter: bool
    retain: int
    reserve: float
    #: The random source of the jitter (a test may pass a seeded one).
    rng: random.Random = field(repr=False, compare=False)

    @renamed(
        min_retry_after_s=Renamed("min_retry_after"),
        max_retry_after_s=Renamed("max_retry_after"),
        max_ttl_s=Renamed("max_ttl"),
        retain_s=Renamed("retain"),
    )
    def __init__(
        self,
        min_retry_after: Duration = 1,
        max_retry_after: Duration = 60,
        max_ttl: Duration = 900,
        max_attempts: int | None = None,
        poll_rate_cap: int = 100,
        per_module_inflight: int = 4,
        jitter: bool = True,
        retain: Duration = 86400,
        rng: random.Random = _rng,
        reserve: Duration | None = None,
    ) -> None:
        spans = {
            "min_retry_after": min_retry_after,
            "max_retry_after": max_retry_after,
            "max_ttl": max_ttl,
            "retain": retain,
        }
        for name, value in spans.items():
            object.__setattr__(self, name, _whole_seconds(name, value))
        for name, count in (
            ("max_attempts", max_attempts),
            ("poll_rate_cap", poll_rate_cap),
            ("per_module_inflight", per_module_inflight),
        ):
            _positive_int(name, count, allow_none=name == "max_attempts")
            object.__setattr__(self, name, count)
        if not isinstance(jitter, bool):
            raise ConfigurationError(f"HostPolicy(jitter=...) takes a bool, not {jitter!r}")
        object.__setattr__(self, "jitter", jitter)
        object.__setattr__(self, "rng", rng)
        object.__setattr__(self, "reserve", reserve_seconds(reserve))
        if self.min_retry_after > self.max_retry_after:
            raise ConfigurationError(
                f"HostPolicy: min_retry_after ({format_duration(self.min_retry_after)}) is above "
                f"max_retry_after ({format_duration(self.max_retry_after)})"
            )

    min_retry_after_s = _deprecated_field("min_retry_after")
    max_retry_after_s = _deprecated_field("max_retry_after")
    max_ttl_s = _deprecated_field("max_ttl")
    retain_s = _deprecated_field("retain")

    def check_retry_after(self, hint: object) -> tuple[int, bool]:
        """The clamped interval, and whether the hint was valid (if not: the minimum)."""
        if isinstance(hint, bool) or not isinstance(hint, int) or hint <= 0:
            return self.min_retry_after, False
        return max(self.min_retry_after, min(hint, self.max_retry_after)), True

    def retry_after(self, hint: object) -> int:
        """``clamp(hint, min_retry_after, max_retry_after)``; an invalid hint: the minimum."""
        return self.check_retry_after(hint)[0]

    def jitter_s(self, retry_after: int) -> float:
        """Additive jitter, ``U[0, min(0.2 * retry_after, 5 s)]`` (zero when jitter is off)."""
        if not self.jitter:
            return 0.0
        return self.rng.uniform(0.0, min(0.2 * retry_after, 5.0))

    def poll_delay_s(self, retry_after: int, polls: int) -> float:
        """The wait before the next poll after ``polls`` polls (at least 1): the cadence stretches.

        The n-th wait is ``retry_after * 2**(n-1)``, at most ``max_retry_after`` (the retry
        decision core's exponential backoff), plus the additive jitter. An operation that keeps
        answering ``pending`` every second is asked about twenty times in fifteen minutes, not
        nine hundred (the retry-storm failure mode); no wait is shorter than ``retry_after``.
        """
        plan = RetryPlan(
            "deferred poll",
            delay=float(retry_after),
            backoff="exponential",
            max_delay=float(max(self.max_retry_after, retry_after)),
        )
        return plan.delay_after(max(polls, 1)) + self.jitter_s(retry_after)

    @renamed(fail_after_s=Renamed("fail_after"), action_max_ttl_s=Renamed("action_max_ttl"))
    def lifetime_s(
        self,
        now_epoch_ms: int,
        *,
        fail_after: Duration | None = None,
        action_max_ttl: Duration | None = None,
        caller_deadline: Deadline | datetime | int | None = None,
    ) -> float:
        """The effective lifetime in seconds: ``min(min_present(...), max_ttl)``, counted from
        ``now_epoch_ms`` (a stored instant, D6.12).

        ``fail_after`` and ``action_max_ttl`` are durations. ``caller_deadline`` is a
        :class:`Deadline`, an aware ``datetime`` (rounded up to the millisecond, never earlier,
        D1.3) or a stored epoch-ms instant (exact: a ``Deadline`` read back through the clocks
        may round up by a millisecond). A caller deadline already spent raises
        ``DeadlineExceeded(source="deferred")``.
        """
        return self.lifetime_bound(
            now_epoch_ms,
            fail_after=fail_after,
            action_max_ttl=action_max_ttl,
            caller_deadline=caller_deadline,
        )[0]

    def lifetime_bound(
        self,
        now_epoch_ms: int,
        *,
        fail_after: Duration | None = None,
        action_max_ttl: Duration | None = None,
        caller_deadline: Deadline | datetime | int | None = None,
    ) -> tuple[float, str]:
        """:meth:`lifetime_s` and where it was set (D2.8): ``connector`` (its ``expires_at``),
        ``action`` (its max TTL), ``caller`` (its deadline), ``reserve of caller`` (its deadline
        less the policy's ``reserve``, D7.16) or ``host policy`` (``max_ttl``); at a tie the
        larger scope (host policy, caller, action, connector), as D6.4."""
        present: list[tuple[float, int, str]] = []
        for rank, name, value in (
            (3, "fail_after", fail_after),
            (2, "action_max_ttl", action_max_ttl),
        ):
            if value is None:
                continue
            try:
                seconds = to_seconds(value, option=name)
            except ConfigurationError as exc:
                raise ConfigurationError(f"HostPolicy.expires_at: {exc}", option=name) from None
            present.append((seconds, rank, "connector" if rank == 3 else "action"))
        if caller_deadline is not None:
            until_ms = _caller_epoch_ms(caller_deadline)
            if until_ms is not None:
                left = (until_ms - now_epoch_ms) / 1000
                if left <= 0:
                    raise DeadlineExceeded(
                        "the caller's deadline passed before the deferred operation was created",
                        source="deferred",
                        deadline=caller_deadline
                        if isinstance(caller_deadline, Deadline)
                        else Deadline.from_epoch_ms(until_ms),
                        set_by="caller",
                    )
                if self.reserve:
                    if left <= self.reserve:
                        # D1.20: an operation created now could only expire before the host
                        # had time to record its end and resume its caller.
                        raise DeadlineExceeded(
                            f"the caller had {format_duration(left)} left, no more than the "
                            f"host's reserve of {format_duration(self.reserve)}: no deferred "
                            "operation was created",
                            source="deferred",
                            deadline=Deadline.from_epoch_ms(until_ms),
                            set_by="reserve of caller",
                        )
                    present.append((left - self.reserve, 1, "reserve of caller"))
                else:
                    present.append((left, 1, "caller"))
        max_ttl = float(self.max_ttl)
        if not present or min(present)[0] >= max_ttl:
            return max_ttl, "host policy"
        requested, _, set_by = min(present)
        return max(0.0, requested), set_by

    @renamed(fail_after_s=Renamed("fail_after"), action_max_ttl_s=Renamed("action_max_ttl"))
    def expires_at(
        self,
        now: datetime,
        *,
        fail_after: Duration | None = None,
        action_max_ttl: Duration | None = None,
        caller_deadline: Deadline | datetime | int | None = None,
    ) -> datetime:
        """``now + min(min_present(fail_after, action_max_ttl, caller_deadline - now),
        max_ttl)``."""
        if now.tzinfo is None:
            raise ConfigurationError("HostPolicy.expires_at(now=...) takes an aware datetime (UTC)")
        now_ms = ms_of(now)  # exact (float seconds could land a millisecond off)
        life = self.lifetime_s(
            now_ms,
            fail_after=fail_after,
            action_max_ttl=action_max_ttl,
            caller_deadline=caller_deadline,
        )
        return datetime_of_ms(now_ms + math.floor(life * 1000))

    def describe(self) -> dict[str, Any]:
        """The policy as plain data (for operator views; the ``*_s`` keys are whole seconds)."""
        return {
            "min_retry_after_s": self.min_retry_after,
            "max_retry_after_s": self.max_retry_after,
            "max_ttl_s": self.max_ttl,
            "max_attempts": self.max_attempts,
            "poll_rate_cap": self.poll_rate_cap,
            "per_module_inflight": self.per_module_inflight,
            "jitter": self.jitter,
            "retain_s": self.retain,
            "reserve_ms": round(self.reserve * 1000),
        }


def _caller_epoch_ms(caller_deadline: object) -> int | None:
    """A caller deadline as whole epoch ms (``None``: never), or a ConfigurationError saying
    what to pass."""
    if isinstance(caller_deadline, Deadline | datetime):
        # Rounded up, as Deadline.to_epoch_ms rounds: the operation never ends before it (D1.3).
        return instant_epoch_ms(caller_deadline, option="caller_deadline")
    if isinstance(caller_deadline, int) and not isinstance(caller_deadline, bool):
        return caller_deadline
    raise ConfigurationError(
        "HostPolicy caller_deadline takes a timebound.Deadline, an aware datetime or epoch "
        f"milliseconds (int), not {type(caller_deadline).__name__}",
        option="caller_deadline",
    )
