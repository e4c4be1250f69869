"""RFC 9457 problem documents, the one error shape of every HTTP surface timebound serves (D8.2):
the host's API and the deferred status routes a service (or the host) mounts (D8.23); and a
:class:`~timebound.DeadlineExceeded` as one (:func:`deadline_problem`), the shape the host's
event wire gives a bound that fired (D10.12)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from ._breakdown import as_breakdown
from ._deadline import Deadline
from ._errors import SOURCES, ConfigurationError, DeadlineExceeded

__all__ = [
    "MAX_ECHO_CHARS",
    "PROBLEM_JSON",
    "deadline_from_problem",
    "deadline_problem",
    "problem_body",
    "problem_bytes",
]

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


def deadline_problem(err: DeadlineExceeded) -> dict[str, Any]:
    """``err`` as a problem document (``504``, ``code`` ``deadline-exceeded``, ``detail`` its
    message), with which bound fired (D2.1, D2.8): ``source``, ``timeout_ms`` (its length, or
    ``null``), ``deadline_epoch_ms`` (the instant it reached, whole epoch ms rounded up, or
    ``null``), ``set_by`` and ``breakdown`` (where the budget went, D13, or ``null``).
    :func:`deadline_from_problem` reads it back."""
    deadline = err.deadline
    bd = err.breakdown
    return problem_body(
        504,
        str(err.args[0]) if err.args else err.code,
        code=err.code,
        source=err.source,
        timeout_ms=None if err.timeout is None else err.timeout * 1000.0,
        deadline_epoch_ms=deadline.to_epoch_ms() if isinstance(deadline, Deadline) else None,
        set_by=err.set_by,
        breakdown=None if bd is None else bd.to_dict(),
    )


def deadline_from_problem(doc: Any, *, where: str = "bound") -> DeadlineExceeded:
    """The :class:`~timebound.DeadlineExceeded` a :func:`deadline_problem` document describes;
    a malformed one raises :class:`~timebound.ConfigurationError` naming the member at fault
    (under ``where``)."""
    if not isinstance(doc, Mapping):
        raise ConfigurationError(f"{where}: expected a problem document object", option=where)
    source = doc.get("source")
    if source not in SOURCES:
        raise ConfigurationError(
            f"{where}.source: expected one of {sorted(SOURCES)}, got {source!r:.60}",
            option=f"{where}.source",
        )
    timeout_ms = doc.get("timeout_ms")
    if timeout_ms is not None and (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, int | float)
        or not math.isfinite(timeout_ms)
        or timeout_ms < 0
    ):
        raise ConfigurationError(
            f"{where}.timeout_ms: expected a non-negative number or null, got {timeout_ms!r:.60}",
            option=f"{where}.timeout_ms",
        )
    epoch_ms = doc.get("deadline_epoch_ms")
    if epoch_ms is not None and (isinstance(epoch_ms, bool) or not isinstance(epoch_ms, int)):
        raise ConfigurationError(
            f"{where}.deadline_epoch_ms: expected whole epoch milliseconds or null, "
            f"got {epoch_ms!r:.60}",
            option=f"{where}.deadline_epoch_ms",
        )
    detail, set_by = doc.get("detail"), doc.get("set_by")
    err = DeadlineExceeded(
        detail if isinstance(detail, str) else None,
        source=source,
        timeout=None if timeout_ms is None else timeout_ms / 1000.0,
        deadline=None if epoch_ms is None else Deadline.from_epoch_ms(epoch_ms),
        set_by=set_by if isinstance(set_by, str) else None,
    )
    err.breakdown = as_breakdown(doc.get("breakdown"))
    return err
