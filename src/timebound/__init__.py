"""timebound: one deadline model for Python.

A deadline enters with a request, and every scope, retry, pipeline region, workflow node,
deferred operation, outgoing call and database query under it sees the smallest remaining budget.
"""

from __future__ import annotations

from ._version import __version__ as __version__

# typing.TYPE_CHECKING without importing typing (a third of an import's cost); mypy treats
# any name TYPE_CHECKING as true, so it sees these names and no __getattr__ (a typo in
# `timebound.fial_after` stays a type error).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._core._body import TooLarge as TooLarge
    from ._core._breakdown import Breakdown as Breakdown
    from ._core._deadline import Deadline as Deadline
    from ._core._durations import Duration as Duration
    from ._core._durations import format_duration as format_duration
    from ._core._durations import to_seconds as to_seconds
    from ._core._errors import CircuitOpen as CircuitOpen
    from ._core._errors import ConfigurationError as ConfigurationError
    from ._core._errors import DeadlineExceeded as DeadlineExceeded
    from ._core._errors import InvalidInput as InvalidInput
    from ._core._errors import RetryExhausted as RetryExhausted
    from ._core._errors import TimeboundError as TimeboundError
    from ._core._preempt import AbandonedThreadWarning as AbandonedThreadWarning
    from ._core._preempt import abandoned_threads as abandoned_threads
    from ._core._preempt import run_in_process as run_in_process
    from ._core._preempt import run_in_thread as run_in_thread
    from ._core._preempt import run_with_signal as run_with_signal
    from ._core._scopes import CancelScope as CancelScope
    from ._core._scopes import acheckpoint as acheckpoint
    from ._core._scopes import checkpoint as checkpoint
    from ._core._scopes import current_deadline as current_deadline
    from ._core._scopes import fail_after as fail_after
    from ._core._scopes import fail_at as fail_at
    from ._core._scopes import inherit_deadline as inherit_deadline
    from ._core._scopes import move_on_after as move_on_after
    from ._core._scopes import move_on_at as move_on_at
    from ._core._scopes import no_deadline as no_deadline
    from ._core._scopes import remaining as remaining
    from ._core._scopes import spawn_background as spawn_background
    from ._json import JSONError as JSONError
    from ._json import TooDeep as TooDeep
    from .policies import resilient as resilient

__all__ = [
    "AbandonedThreadWarning",
    "Breakdown",
    "CancelScope",
    "CircuitOpen",
    "ConfigurationError",
    "Deadline",
    "DeadlineExceeded",
    "Duration",
    "InvalidInput",
    "JSONError",
    "RetryExhausted",
    "TimeboundError",
    "TooDeep",
    "TooLarge",
    "abandoned_threads",
    "acheckpoint",
    "checkpoint",
    "current_deadline",
    "fail_after",
    "fail_at",
    "format_duration",
    "inherit_deadline",
    "move_on_after",
    "move_on_at",
    "no_deadline",
    "remaining",
    "resilient",
    "run_in_process",
    "run_in_thread",
    "run_with_signal",
    "spawn_background",
    "to_seconds",
]

# Where each public name lives. `import timebound` loads none of them: the first use of a name
# imports its module (PEP 562). A program pays for what it touches, and `timebound --help` or
# `--version` (the CLI is a sub-package, so the root package loads first) pays for nothing.
_LOCATIONS: dict[str, str] = {
    "AbandonedThreadWarning": "._core._preempt",
    "Breakdown": "._core._breakdown",
    "CancelScope": "._core._scopes",
    "CircuitOpen": "._core._errors",
    "ConfigurationError": "._core._errors",
    "Deadline": "._core._deadline",
    "DeadlineExceeded": "._core._errors",
    "Duration": "._core._durations",
    "InvalidInput": "._core._errors",
    "RetryExhausted": "._core._errors",
    "TimeboundError": "._core._errors",
    "JSONError": "._json",
    "TooDeep": "._json",
    "TooLarge": "._core._body",
    "abandoned_threads": "._core._preempt",
    "acheckpoint": "._core._scopes",
    "checkpoint": "._core._scopes",
    "current_deadline": "._core._scopes",
    "fail_after": "._core._scopes",
    "fail_at": "._core._scopes",
    "inherit_deadline": "._core._scopes",
    "move_on_after": "._core._scopes",
    "move_on_at": "._core._scopes",
    "no_deadline": "._core._scopes",
    "remaining": "._core._scopes",
    "resilient": ".policies",
    "run_in_process": "._core._preempt",
    "run_in_thread": "._core._preempt",
    "run_with_signal": "._core._preempt",
    "spawn_background": "._core._scopes",
    "to_seconds": "._core._durations",
    "format_duration": "._core._durations",
}


if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _LOCATIONS.get(name)
        if module is None:
            raise AttributeError(f"module 'timebound' has no attribute {name!r}")
        from importlib import import_module  # here: `import timebound` alone needs none of it

        value = getattr(import_module(module, __name__), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


del TYPE_CHECKING
