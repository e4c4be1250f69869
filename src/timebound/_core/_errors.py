"""The error hierarchy (DECISIONS D2): one root, builtin bases callers already catch, picklable."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "CircuitOpen",
    "ConfigurationError",
    "DeadlineExceeded",
    "InvalidInput",
    "RetryExhausted",
    "Source",
    "TimeboundError",
]

#: Which bound fired (D2.1).
Source = Literal[
    "scope",
    "attempt",
    "total",
    "inherited",
    "propagated",
    "region",
    "workflow",
    "node",
    "synchronization",
    "deferred",
]

SOURCES: frozenset[str] = frozenset(
    (
        "scope",
        "attempt",
        "total",
        "inherited",
        "propagated",
        "region",
        "workflow",
        "node",
        "synchronization",
        "deferred",
    )
)


def _extra_state(err: BaseException) -> dict[str, Any] | None:
    """Attributes attached after construction (e.g. a Constellation ``call_site``), for pickling.

    timebound's private bookkeeping (``_timebound_*``: the live scope that raised the error) is
    process-local and is dropped.
    """
    state = {k: v for k, v in vars(err).items() if not k.startswith("_timebound")}
    return state or None


class TimeboundError(Exception):
    """Root of every error timebound raises. ``code`` is stable for storage, UIs and CLIs."""

    code = "timebound-error"


class InvalidInput(TimeboundError, ValueError):
    """Your input is invalid (D2.6): an option, a workflow definition, a pipeline plan, a
    Constellation program, a deferred-operation document, the host's configuration.

    ``except timebound.InvalidInput`` catches every one of them. Each subclass keeps its own
    stable ``code`` and its own attribute naming the field at fault (``option``, ``path``,
    ``node_id``, ``diagnostics``); :attr:`field` gives that path in one spelling.
    """

    code = "invalid-input"

    @property
    def field(self) -> str | None:
        """The path of the field at fault (``timeout``, ``nodes[2].timeout_ms``), when known."""
        return None


class ConfigurationError(InvalidInput):
    """An option was invalid when a scope or policy was built. ``option`` names it."""

    code = "configuration-error"

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option

    @property
    def field(self) -> str | None:
        return self.option

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_configuration_error,
            (str(self), self.option, type(self)),
            _extra_state(self),
        )


def _rebuild_configuration_error(
    message: str, option: str | None, cls: type[ConfigurationError] = ConfigurationError
) -> ConfigurationError:
    # A subclass whose __init__ takes the same arguments (the host's ConfigError) pickles as
    # itself; one with its own signature defines its own __reduce__.
    return cls(message, option=option)


def deadline_message(source: str, timeout: float | None, what: str | None) -> str:
    """The default text of a :class:`DeadlineExceeded` for these fields."""
    # Here, not at the top: _durations raises this module's ConfigurationError.
    from ._durations import format_duration

    finite = timeout is not None and math.isfinite(timeout)
    if what is not None:
        if finite and timeout is not None:
            return f"{what} timed out after {format_duration(timeout)} ({source} deadline)"
        return f"{what} timed out ({source} deadline exceeded)"
    if finite and timeout is not None:
        return f"{source} deadline of {format_duration(timeout)} exceeded"
    return f"{source} deadline exceeded"


def set_by_of(source: str, what: str | None) -> str | None:
    """Where a scope's bound was set, from the scope's own ``source`` and ``what`` (D2.8): a
    policy's attempt or total budget is ``policy <name>``; any other scope is its ``what`` (the
    engines name theirs: ``task fetch``, ``workflow node 'A'``, ``group 'r1'``); an unnamed
    scope is ``None``."""
    if source == "attempt" or source == "total":
        return "policy" if what is None else f"policy {what}"
    return what


class DeadlineExceeded(TimeboundError, TimeoutError):
    """A deadline was reached. Also a builtin ``TimeoutError``.

    ``source`` says which bound fired (``scope``, ``attempt``, ``total``, ``inherited``,
    ``propagated``, ``region``, ``workflow``, ``node``, ``synchronization``, ``deferred``);
    ``timeout`` is the relative budget in seconds when known; ``deadline`` is the
    :class:`~timebound.Deadline` that was reached, when known; ``set_by`` says where that bound
    was set, its kind first (``policy GetUser``, ``ASGI middleware``, ``node A``, ``definition
    report``, ``caller``, ``region r1``, ``host policy``…), or ``None`` when nobody named it
    (D2.8).
    """

    code = "deadline-exceeded"
    #: Where the bound was set (D2.8); a class default for subclasses built without it.
    set_by: str | None = None

    def __init__(
        self,
        message: str | None = None,
        *,
        source: str = "scope",
        timeout: float | None = None,
        deadline: Any = None,
        what: str | None = None,
        set_by: str | None = None,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"unknown deadline source {source!r}")
        if message is None:
            message = deadline_message(source, timeout, what)
        super().__init__(message)
        self.source = source
        self.timeout = timeout
        self.deadline = deadline
        if set_by is not None:
            self.set_by = set_by

    @property
    def breakdown(self) -> Any:
        """Where the budget went (D13): a :class:`~timebound.Breakdown` tree from the bound's
        start to its firing, or ``None`` when the error was not raised by a bound that records
        one. Built on first read."""
        state = self.__dict__
        if "_breakdown" in state:
            return state["_breakdown"]
        from ._scopes import error_breakdown

        bd = error_breakdown(self)
        state["_breakdown"] = bd
        return bd

    @breakdown.setter
    def breakdown(self, value: Any) -> None:
        self.__dict__["_breakdown"] = value

    def __str__(self) -> str:
        text = super().__str__()
        bd = self.breakdown
        if bd is None or not _worth_showing(bd):
            return text
        summary = f" [{bd.summary()}]"
        # A Constellation call site (D3.10) stays the message's last words.
        site = self.__dict__.get("call_site")
        where = None if site is None else f" [at {site}]"
        if where is not None and where in text:
            head, _, tail = text.partition(where)
            return f"{head}{summary}{where}{tail}"
        return f"{text}{summary}"

    #: Attributes a subclass holds from the failed call's live objects (a request, call
    #: metadata) that may not pickle: they arrive as ``None``; every other attribute travels.
    _live_attributes: frozenset[str] = frozenset()

    def __reduce__(self) -> tuple[Any, ...]:
        # One reduction for the class and every subclass, whatever its constructor takes: the
        # rebuilt error gets its args and its attributes back, breakdown and set_by included.
        self.breakdown  # noqa: B018 -- built now: the live frames it reads do not pickle
        live = self._live_attributes
        state = {
            k: None if k in live else v
            for k, v in vars(self).items()
            if not k.startswith("_timebound")
        }
        return (_rebuild_deadline_exceeded, (type(self), self.args), state)


def _worth_showing(bd: Any) -> bool:
    """A breakdown whose only parts are the code of the bound itself (and how late it fired)
    says nothing new."""
    return any(p.kind != "self" and p.kind != "late" for p in bd.parts)


def new_deadline_exceeded(
    message: str, source: str, timeout: float | None, deadline: Any, set_by: str | None = None
) -> DeadlineExceeded:
    """A DeadlineExceeded with fields already validated (the scopes' path at expiry).

    The same object ``DeadlineExceeded(message, source=..., ...)`` builds, without the Python
    ``__init__`` call chain: it runs for every firing deadline, between the timer and the caller.
    """
    err = _exception_new(DeadlineExceeded)
    err.args = (message,)
    err.source = source
    err.timeout = timeout
    err.deadline = deadline
    if set_by is not None:
        err.set_by = set_by
    return err


_exception_new = DeadlineExceeded.__new__


def _rebuild_deadline_exceeded(
    cls: type[DeadlineExceeded], args: tuple[Any, ...]
) -> DeadlineExceeded:
    err = cls.__new__(cls)
    err.args = args
    return err


class RetryExhausted(TimeboundError):
    """Every attempt failed (D3.1): ``attempts`` counts them, ``errors`` holds each one's error."""

    code = "retry-exhausted"

    def __init__(
        self,
        errors: Sequence[BaseException],
        *,
        what: str | None = None,
        message: str | None = None,
    ) -> None:
        self.errors: list[BaseException] = list(errors)
        self.attempts = len(self.errors)
        self.what = what
        if message is None:
            subject = what or "call"
            lines = [f"{subject} failed after {self.attempts} attempts"]
            for i, err in enumerate(self.errors, 1):
                lines.append(f"  attempt {i}: {type(err).__name__}: {err}")
            message = "\n".join(lines)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_retry_exhausted,
            (self.errors, self.what, str(self)),
            _extra_state(self),
        )


def _rebuild_retry_exhausted(
    errors: list[BaseException], what: str | None, message: str
) -> RetryExhausted:
    return RetryExhausted(errors, what=what, message=message)


class CircuitOpen(TimeboundError):
    """A circuit breaker is open: the call failed fast, without reaching the dependency (D3.13).

    ``retry_after`` is the seconds until the breaker lets a probe through (``None`` while its
    probes are in flight), so a retry loop waits for it or, when that is past the deadline,
    stops (D3.11). ``what`` names the policy.
    """

    code = "circuit-open"

    def __init__(
        self, message: str, *, what: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.what = what
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_circuit_open,
            (str(self), self.what, self.retry_after),
            _extra_state(self),
        )


def _rebuild_circuit_open(message: str, what: str | None, retry_after: float | None) -> CircuitOpen:
    return CircuitOpen(message, what=what, retry_after=retry_after)
