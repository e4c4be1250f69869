"""Deadline propagation for grpcio, sync and ``grpc.aio`` (DECISIONS D4.6, D4.7, D4.12).

Server interceptors make the client's deadline (``grpc-timeout``, and the absolute
``x-request-deadline`` metadata under the clock-skew rule) the handler's inherited deadline and
reject a call whose deadline is already spent (``DEADLINE_EXCEEDED``, ``Deadline propagation:
Not enough time to handle this call``). Client interceptors lower every call's timeout to the
time left, send the call's absolute deadline beside it, fail locally when none is left, and
surface a ``DEADLINE_EXCEEDED`` that our own deadline caused as
:class:`PropagatedDeadlineExceeded` (a ``DeadlineExceeded`` *and* a ``grpc.RpcError``).
See ``docs/propagation-grpc.md``. Needs ``pip install 'timebound[grpc]'``.
"""

from __future__ import annotations

from ._admission import OVERLOADED_DETAILS, admission_interceptor, aio_admission_interceptor
from ._interceptors import (
    ABSOLUTE_METADATA,
    DEFAULT_RETRY_CODES,
    EXPIRED_DETAILS,
    AioPropagatedDeadlineExceeded,
    PropagatedDeadlineExceeded,
    aio_client_interceptor,
    aio_client_interceptors,
    aio_server_interceptor,
    client_interceptor,
    server_interceptor,
)

__all__ = [
    "ABSOLUTE_METADATA",
    "AioPropagatedDeadlineExceeded",
    "DEFAULT_RETRY_CODES",
    "EXPIRED_DETAILS",
    "OVERLOADED_DETAILS",
    "admission_interceptor",
    "aio_admission_interceptor",
    "PropagatedDeadlineExceeded",
    "aio_client_interceptor",
    "aio_client_interceptors",
    "aio_server_interceptor",
    "client_interceptor",
    "server_interceptor",
]
