"""Bounded deferred operations (Orbiplex P055; DECISIONS D7).

Long work is a bounded handle: a connector answers at once with ``deferred-operation.v1``, and
the host owns cadence, expiry and cancellation. This package holds the contract
(:func:`validate_operation`, :func:`validate_status`), the host policy (:class:`HostPolicy`),
the durable :class:`Registry` and its state machine, the :class:`Poller`, continuations that
resume exactly once, Python connectors (:class:`Service`) and the HTTP surface
(:func:`status_app`, :class:`HttpConnector`). See ``docs/deferred.md``.
"""

from __future__ import annotations

from ._contract import SchemaError, validate_operation, validate_status
from ._http import HttpConnector, status_app
from ._policy import HostPolicy
from ._poller import Connector, Poller, TransientPollError
from ._registry import (
    CONTINUATION_SCHEMA,
    ContinuationRefused,
    Gone,
    IdempotencyConflict,
    Operation,
    Registry,
    Resumption,
    StatusOutcome,
)
from ._service import Overloaded, Service, UnknownKind

__all__ = [
    "CONTINUATION_SCHEMA",
    "Connector",
    "ContinuationRefused",
    "Gone",
    "HostPolicy",
    "HttpConnector",
    "IdempotencyConflict",
    "Operation",
    "StatusOutcome",
    "Overloaded",
    "Poller",
    "Registry",
    "Resumption",
    "SchemaError",
    "Service",
    "TransientPollError",
    "UnknownKind",
    "status_app",
    "validate_operation",
    "validate_status",
]


def __getattr__(name: str) -> object:
    # Renamed so that one name does not mean two things (admission had an Outcome too).
    if name == "Outcome":
        import warnings

        warnings.warn(
            "timebound.deferred.Outcome is now timebound.deferred.StatusOutcome",
            DeprecationWarning,
            stacklevel=2,
        )
        return StatusOutcome
    raise AttributeError(f"module 'timebound.deferred' has no attribute {name!r}")
