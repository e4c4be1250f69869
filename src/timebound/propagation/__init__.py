"""Deadline propagation across services, wire-compatible with userver (DECISIONS D4).

Adapters live in submodules so that importing this package needs nothing outside the standard
library: :mod:`~timebound.propagation.asgi`, :mod:`~timebound.propagation.wsgi` (servers),
:mod:`~timebound.propagation.httpx`, :mod:`~timebound.propagation.requests`,
:mod:`~timebound.propagation.aiohttp` (HTTP clients), :mod:`~timebound.propagation.grpc`,
:mod:`~timebound.propagation.asyncpg`, :mod:`~timebound.propagation.psycopg` and
:mod:`~timebound.propagation.redis`. Their implementations live in three rooms, ``http/``,
``grpc/`` and ``db/``; the modules beside this one are what the rooms share (the wire codec, the
request state, outgoing attempts, the absolute-deadline rule, the switch, :func:`detached`).
Admission control is :mod:`timebound.admission`.
"""

from ._codec import (
    ENVOY_TIMEOUT_HEADER,
    EXPIRED_HEADER,
    GRPC_TIMEOUT_HEADER,
    TIMEOUT_HEADER,
    HeaderNames,
    format_grpc_timeout,
    format_timeout_ms,
    parse_envoy_timeout,
    parse_grpc_timeout,
    parse_timeout_ms,
)
from ._config import is_enabled, set_enabled
from ._detach import detached
from ._state import (
    ClampedTimeout,
    RequestState,
    clamp_timeout,
    current_request,
    mark_cancelled_by_deadline,
)

__all__ = [
    "ENVOY_TIMEOUT_HEADER",
    "EXPIRED_HEADER",
    "GRPC_TIMEOUT_HEADER",
    "TIMEOUT_HEADER",
    "ClampedTimeout",
    "HeaderNames",
    "RequestState",
    "clamp_timeout",
    "current_request",
    "detached",
    "format_grpc_timeout",
    "format_timeout_ms",
    "is_enabled",
    "mark_cancelled_by_deadline",
    "parse_envoy_timeout",
    "parse_grpc_timeout",
    "parse_timeout_ms",
    "set_enabled",
]
