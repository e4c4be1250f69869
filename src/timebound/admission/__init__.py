"""Deadline-aware admission control (DECISIONS D9): the public names.

The middlewares and interceptors that use it live beside the deadline ones:
:class:`timebound.propagation.asgi.AdmissionMiddleware`,
:class:`timebound.propagation.wsgi.AdmissionMiddleware`. See ``docs/propagation.md``.
"""

from ._controller import (
    Admission,
    AdmissionConfig,
    AdmissionStats,
    AIMDLimit,
    FixedLimit,
    Limit,
    RouteEstimates,
    Ticket,
    Verdict,
)

__all__ = [
    "AIMDLimit",
    "Admission",
    "AdmissionConfig",
    "AdmissionStats",
    "FixedLimit",
    "Limit",
    "Verdict",
    "RouteEstimates",
    "Ticket",
]
