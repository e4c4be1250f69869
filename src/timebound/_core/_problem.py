"""RFC 9457 problem documents, the one error shape of every HTTP surface timebound serves (D8.2):
the host's API and the deferred status routes a service (or the host) mounts (D8.23)."""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["MAX_ECHO_CHARS", "PROBLEM_JSON", "problem_body", "problem_bytes"]

PROBLEM_JSON: Final = "application/problem+json"

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    421: "Misdirected Request",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

#: The longest text a problem document carries in one field (D8.11): what a request sent (a
#: 10,001-item array quoted by a validation error) is never echoed whole.
MAX_ECHO_CHARS: Final = 1_000


def _capped(text: str) -> str:
    if len(text) <= MAX_ECHO_CHARS:
        return text
    return f"{text[: MAX_ECHO_CHARS - 30]}... ({len(text)} characters)"


def problem_body(
    status: int, detail: str, instance: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The document: ``type`` (``about:blank``), ``title`` (the status's), ``status``,
    ``detail``, ``instance`` (the path asked) when given, then ``extra`` members (``code``,
    ``path``, ``run_id``…); text members are capped at :data:`MAX_ECHO_CHARS`."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": _capped(detail),
    }
    if instance is not None:
        body["instance"] = _capped(instance)
    body.update({k: _capped(v) if isinstance(v, str) else v for k, v in extra.items()})
    return body


def problem_bytes(status: int, detail: str, instance: str | None = None, **extra: Any) -> bytes:
    """:func:`problem_body` encoded as the response body."""
    return json.dumps(problem_body(status, detail, instance, **extra)).encode("utf-8")
