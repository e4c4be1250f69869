"""Deadline propagation across services, wire-compatible with userver (DECISIONS D4)."""

from ._state import (
    ClampedTimeout,
    RequestState,
    clamp_timeout,
    current_request,
    mark_cancelled_by_deadline,
)

__all__ = [
    "ClampedTimeout",
    "RequestState",
    "clamp_timeout",
    "current_request",
    "mark_cancelled_by_deadline",
]
