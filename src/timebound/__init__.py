"""timebound: one deadline model for Python.

A deadline enters with a request, and every scope, retry, pipeline region, workflow node,
deferred operation, outgoing call and database query under it sees the smallest remaining budget.
"""

from ._core._deadline import Deadline
from ._core._durations import Duration
from ._core._errors import ConfigurationError, DeadlineExceeded, RetryExhausted, TimeboundError
from ._core._preempt import (
    AbandonedThreadWarning,
    abandoned_threads,
    run_in_process,
    run_in_thread,
    run_with_signal,
)
from ._core._scopes import (
    CancelScope,
    acheckpoint,
    checkpoint,
    current_deadline,
    fail_after,
    fail_at,
    inherit_deadline,
    move_on_after,
    move_on_at,
    no_deadline,
    remaining,
    spawn_background,
)
from .policies import resilient

__version__ = "0.1.0"

__all__ = [
    "AbandonedThreadWarning",
    "CancelScope",
    "ConfigurationError",
    "Deadline",
    "DeadlineExceeded",
    "Duration",
    "RetryExhausted",
    "TimeboundError",
    "abandoned_threads",
    "acheckpoint",
    "checkpoint",
    "current_deadline",
    "fail_after",
    "fail_at",
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
]
