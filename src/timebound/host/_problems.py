"""RFC 9457 problem documents: the only shape an error of the host ever has (D8.2)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

__all__ = ["Problem", "problem_response"]

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


class Problem(Exception):
    """An error answered as ``application/problem+json``; ``detail`` names what was wrong,
    ``headers`` go with the answer (``Retry-After``, ``Allow``), ``extra`` into its body."""

    def __init__(
        self, status: int, detail: str, *, headers: Mapping[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.extra = status, detail, extra
        self.headers = dict(headers or {})


#: The longest text a problem document carries in one field (D8.11): what a request sent (a
#: 10,001-item array quoted by a validation error) is never echoed whole.
MAX_ECHO_CHARS = 1_000


def _capped(text: str) -> str:
    if len(text) <= MAX_ECHO_CHARS:
        return text
    return f"{text[: MAX_ECHO_CHARS - 30]}... ({len(text)} characters)"


def problem_response(
    status: int,
    detail: str,
    instance: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": _capped(detail),
    }
    if instance is not None:
        body["instance"] = _capped(instance)
    body.update({k: _capped(v) if isinstance(v, str) else v for k, v in extra.items()})
    sent = dict(headers or {})
    if status == 401:
        sent["WWW-Authenticate"] = 'Bearer realm="timebound"'
    return Response(
        json.dumps(body),
        status_code=status,
        media_type="application/problem+json",
        headers=sent,
    )
