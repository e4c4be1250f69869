"""Server retry hints (DECISIONS D3.11): when a failed attempt's answer says to come back.

A server that sheds load says when a retry may come: HTTP's ``Retry-After`` on a 429 or 503
(whole seconds, or an HTTP date), gRPC's ``grpc-retry-pushback-ms`` trailer (milliseconds; a
negative or malformed value means "do not retry"). timebound's own hosts send both (D9.1). The
error an attempt raised is read duck-typed, so no client library is imported here:

- ``exc.retry_after`` (seconds, a number): set by timebound's own errors (an open circuit
  breaker) and free for any error type;
- ``exc.response`` with ``status_code`` 429/503 and ``headers`` (httpx's ``HTTPStatusError``,
  requests' ``HTTPError``), or ``exc.status`` with ``exc.headers`` (aiohttp's
  ``ClientResponseError``);
- ``exc.trailing_metadata()`` (a gRPC ``RpcError``).

:func:`retry_hint` returns the wait in seconds, ``math.inf`` for "the server refuses a retry",
or ``None`` when the error carries no hint. The plan turns it into the next retry's earliest
time, or into the end of the call when it falls past the deadline (see ``_retry``).
"""

from __future__ import annotations

import math
from typing import Any, Final

from .._core import _clock

__all__ = [
    "PUSHBACK_KEY",
    "RETRY_AFTER_STATUSES",
    "parse_pushback",
    "parse_retry_after",
    "retry_hint",
]

#: The statuses whose ``Retry-After`` asks a client to wait before retrying (RFC 9110 §10.2.3).
RETRY_AFTER_STATUSES: Final = frozenset({429, 503})
#: gRPC's retry pushback trailer (gRFC A6).
PUSHBACK_KEY: Final = "grpc-retry-pushback-ms"


def parse_retry_after(value: str | bytes | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or an HTTP date), or ``None``
    when it is absent or malformed (a malformed hint is no hint: the policy's own delay stands)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    # Imported here: an HTTP date is rare, and email.utils is most of what a first policy
    # call would otherwise import (bench/startup.py, first resilient).
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - _clock.wall())


def parse_pushback(value: str | bytes | None) -> float | None:
    """Seconds from a ``grpc-retry-pushback-ms`` value; ``math.inf`` (do not retry) for a negative
    or malformed one, as gRFC A6 says; ``None`` when absent."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = value.strip()
    if not text.isdigit():
        return math.inf
    return int(text) / 1000.0


def retry_hint(exc: BaseException) -> float | None:
    """The wait the failed attempt's answer asks for (see the module documentation)."""
    own = getattr(exc, "retry_after", None)
    if isinstance(own, (int, float)) and not isinstance(own, bool):
        return max(0.0, float(own))
    response = getattr(exc, "response", None)
    if response is not None:
        hint = _http_hint(
            getattr(response, "status_code", None), getattr(response, "headers", None)
        )
        if hint is not None:
            return hint
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        hint = _http_hint(status, getattr(exc, "headers", None))
        if hint is not None:
            return hint
    trailing = getattr(exc, "trailing_metadata", None)
    if callable(trailing):
        return _grpc_hint(trailing)
    return None


def _http_hint(status: Any, headers: Any) -> float | None:
    if status not in RETRY_AFTER_STATUSES or headers is None:
        return None
    try:
        value = headers.get("Retry-After")
        if value is None:
            value = headers.get("retry-after")
    except Exception:
        return None
    return parse_retry_after(value) if isinstance(value, (str, bytes)) else None


def _grpc_hint(trailing: Any) -> float | None:
    try:
        metadata = trailing()
    except Exception:
        return None
    for item in metadata or ():
        try:
            key, value = item
        except (TypeError, ValueError):
            continue
        if key == PUSHBACK_KEY:
            return parse_pushback(value)
    return None
