"""RFC 9457 problem documents: the only shape an error of the host ever has (D8.2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from .._core._problem import PROBLEM_JSON, problem_bytes

__all__ = ["Problem", "problem_response"]


class Problem(Exception):
    """An error answered as ``application/problem+json``; ``detail`` names what was wrong,
    ``headers`` go with the answer (``Retry-After``, ``Allow``), ``extra`` into its body."""

    def __init__(
        self, status: int, detail: str, *, headers: Mapping[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.extra = status, detail, extra
        self.headers = dict(headers or {})


def problem_response(
    status: int,
    detail: str,
    instance: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    sent = dict(headers or {})
    if status == 401:
        sent["WWW-Authenticate"] = 'Bearer realm="timebound"'
    return Response(
        problem_bytes(status, detail, instance, **extra),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=sent,
    )
