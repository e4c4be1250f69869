"""What the host's client sends and receives, shared by the sync and async clients (D8.15).

Each call is a :class:`Call` (method, path, query, body, headers) built here once; the two
clients only do the I/O. The shapes are hand-written ``TypedDict``\\ s of the host's answers, and
``tests/host/test_client.py`` checks every :class:`Call` against the OpenAPI document a real host
serves at ``/openapi.json`` (routes, methods, query parameters, body fields, headers), so the
client cannot drift from the API without a failing test.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict
from urllib.parse import quote

from .._core._deadline import Deadline
from .._core._durations import Duration, to_ms
from .._core._errors import InvalidInput, TimeboundError
from .._core._problem import deadline_from_problem
from ..telemetry import Event as TelemetryEvent
from ..telemetry._durable import at_of

__all__ = [
    "Call",
    "Event",
    "HostConflict",
    "HostError",
    "HostNotFound",
    "HostRejected",
    "HostUnauthorized",
    "HostUnavailable",
    "Operation",
    "OperationDetail",
    "OperationPage",
    "PollOutcome",
    "Run",
    "RunDetail",
    "RunPage",
    "SseParser",
    "calls",
    "raise_for_problem",
    "telemetry_event",
    "wire_event",
]


# ---------------------------------------------------------------------------------- shapes


class _RunRow(TypedDict):
    id: str
    definition_id: str
    definition_version: int
    status: str
    started_at: int
    timeout_at: int
    finished_at: int | None
    error: str | None


class Run(_RunRow, total=False):
    """A run as the host lists it (``GET /v1/runs``; instants in epoch milliseconds) and shows
    it (``run`` of a detail, which adds its ``input``, ``state`` and more)."""

    input: Any
    state: Any


class RunPage(TypedDict):
    runs: list[Run]
    next_cursor: str | None


class RunDetail(TypedDict):
    """``GET /v1/runs/{id}``: the run, its tokens, its timeouts, the bound that fired, its
    timeline, each token's stretches (``attempts``: queued, attempt, delay, waiting; D8.21) and
    how many events it has."""

    run: Run
    tokens: list[dict[str, Any]]
    timeouts: list[dict[str, Any]]
    bound_fired: Any
    timeline: Any
    attempts: list[dict[str, Any]]
    events_count: int


class Event(TypedDict):
    """One event of a run; ``seq`` is its number (1-based), as the event stream's ``id``;
    ``kind`` its stored kind and ``data`` the stored row's other fields, as they always were.

    The rest is the one event record every engine emits (D10.1, D10.12): ``name`` (the telemetry
    event's, ``workflow.<kind>``), ``epoch_ms``, ``correlation`` (kind -> id: ``run``,
    ``token``, ``node``) and ``bound``, the bound that fired as a problem document
    (``source``, ``timeout_ms``, ``deadline_epoch_ms``, ``set_by``, ``breakdown``), or ``None``.
    :func:`telemetry_event` turns it into a :class:`timebound.telemetry.Event`."""

    seq: int
    kind: str
    data: dict[str, Any]
    name: str
    epoch_ms: int | None
    correlation: dict[str, str]
    bound: dict[str, Any] | None


#: A deferred operation's operator view (states, instants as RFC 3339, digests; D7).
Operation = TypedDict(
    "Operation",
    {
        "operation/id": str,
        "operation/kind": str,
        "module": str,
        "status": str,
        "created_at": str,
        "updated_at": str,
        "expires_at": str,
        # Where the lifetime was set: connector, action, caller or host policy (None for an
        # operation stored before this was recorded).
        "expires_set_by": str | None,
        "next_poll_at": str | None,
        "attempts": int,
        "cancelable": bool,
        "cancel/unavailable-reason": str | None,
        "last_error_code": str | None,
        "continuation_digest": str | None,
        "result_digest": str | None,
        "resumed": bool,
    },
)


class OperationPage(TypedDict):
    operations: list[Operation]
    next_cursor: str | None


class OperationDetail(TypedDict):
    operation: Operation
    history: list[dict[str, Any]]


class PollOutcome(TypedDict):
    applied: bool
    code: str | None
    operation: Operation


# ---------------------------------------------------------------------------------- errors

_CODES = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    410: "gone",
    413: "content-too-large",
    415: "unsupported-media-type",
    422: "unprocessable",
    500: "internal-error",
    502: "bad-gateway",
    503: "unavailable",
    504: "gateway-timeout",
}


class HostError(TimeboundError):
    """The host answered a problem document (RFC 9457, D8.2). ``status`` is the HTTP status,
    ``detail`` the host's sentence, ``problem`` the whole document, and ``code`` the problem's
    own ``code`` when it has one (``start-conflict``), else one named after the status
    (``not-found``, ``conflict``)."""

    code = "host-error"

    def __init__(self, detail: str, *, status: int, problem: dict[str, Any] | None = None) -> None:
        super().__init__(f"{detail} (HTTP {status})")
        self.detail, self.status = detail, status
        self.problem: dict[str, Any] = dict(problem or {})
        own = self.problem.get("code")
        self.code = own if isinstance(own, str) and own else _CODES.get(status, type(self).code)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.detail, self.status, self.problem))


def _rebuild(cls: type[HostError], detail: str, status: int, problem: dict[str, Any]) -> HostError:
    return cls(detail, status=status, problem=problem)


class HostUnauthorized(HostError, PermissionError):
    """401/403: no token, or not the host's token (``TIMEBOUND_TOKEN`` for the CLI)."""

    code = "unauthorized"


class HostNotFound(HostError, LookupError):
    """404/410: no such run, definition or operation (410: no longer retained)."""

    code = "not-found"


class HostConflict(HostError):
    """409: the run or operation has already ended, or an idempotency key was used for another
    start (``run_id`` then names the run that key started)."""

    code = "conflict"

    @property
    def run_id(self) -> str | None:
        value = self.problem.get("run_id")
        return value if isinstance(value, str) else None


class HostRejected(HostError, InvalidInput):
    """400/413/415/422: the host refused the request as invalid; :attr:`field` names the field
    when the host said which (the problem's ``path``)."""

    code = "rejected"

    @property
    def field(self) -> str | None:
        path = self.problem.get("path")
        return path if isinstance(path, str) else None


class HostUnavailable(HostError, ConnectionError):
    """5xx: the host or its store could not serve the request."""

    code = "unavailable"


def _error_class(status: int) -> type[HostError]:
    if status in (401, 403):
        return HostUnauthorized
    if status in (404, 410):
        return HostNotFound
    if status == 409:
        return HostConflict
    if 400 <= status < 500:
        return HostRejected
    if status >= 500:
        return HostUnavailable
    return HostError


def raise_for_problem(status: int, content_type: str, body: bytes) -> None:
    """Raise the typed error of a failed answer (a problem document, or any other body)."""
    if status < 400:
        return
    problem: dict[str, Any] = {}
    if content_type.split(";")[0].strip().endswith("json"):
        try:
            loaded = json.loads(body)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            problem = loaded
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = body.decode("utf-8", "replace").strip()[:200] or f"HTTP {status}"
    raise _error_class(status)(detail, status=status, problem=problem)


# ---------------------------------------------------------------------------------- calls


@dataclass(frozen=True)
class Call:
    """One request of the API: ``path`` relative to the host's URL."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: The OpenAPI path template it instantiates (checked by the tests).
    route: str = ""


def _seg(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what}: expected a non-empty string, got {value!r:.60}")
    return quote(value, safe="")


def _filters(**given: str | None) -> dict[str, str]:
    return {k: v for k, v in given.items() if v}


def _deadline_ms(deadline: Deadline | Duration | None) -> int | None:
    """A start's bound for the wire (D1.11): a duration from now, or a :class:`Deadline` (its
    time left, rounded up to whole ms, D1.13); ``None`` and ``Deadline.never()`` send none."""
    if deadline is None:
        return None
    if isinstance(deadline, Deadline):
        ms = deadline.to_timeout_ms()
        if ms is not None and ms <= 0:
            raise InvalidInput("deadline: that Deadline has already passed")
        return ms
    return max(1, to_ms(deadline, option="deadline", allow_zero=False))


def _by_ms(by: Duration) -> int:
    """An extension as whole milliseconds, rounded up (never shorter than asked, D6.27)."""
    return max(1, to_ms(by, option="by", allow_zero=False))


def _action(reason: str, operator: str | None, **fields: Any) -> dict[str, Any]:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("reason: required, a non-empty string (say why, for the run's events)")
    body: dict[str, Any] = {"reason": reason}
    if operator:
        body["operator"] = operator
    body.update((k, v) for k, v in fields.items() if v is not None)
    return body


class calls:
    """The API's calls, each built from its arguments (no I/O)."""

    @staticmethod
    def start(
        definition_id: str,
        input: Any,
        *,
        deadline: Deadline | Duration | None,
        idempotency_key: str | None,
        run_id: str | None,
    ) -> Call:
        # D8.15: every start carries an idempotency key (the caller's, else a fresh one), so
        # the client's own retry of a start whose answer was lost returns the same run.
        key = idempotency_key or f"client-{uuid.uuid4().hex}"
        body: dict[str, Any] = {"input": input}
        ms = _deadline_ms(deadline)
        if ms is not None:
            body["deadline_ms"] = ms
        if run_id is not None:
            body["run_id"] = run_id
        return Call(
            "POST",
            f"/v1/workflows/{_seg(definition_id, 'definition_id')}/runs",
            body=body,
            headers={"Idempotency-Key": key},
            route="/v1/workflows/{definition_id}/runs",
        )

    @staticmethod
    def list_runs(status: str | None, definition: str | None, cursor: str | None) -> Call:
        query = _filters(status=status, definition=definition, cursor=cursor)
        return Call("GET", "/v1/runs", query=query, route="/v1/runs")

    @staticmethod
    def get_run(run_id: str) -> Call:
        return Call("GET", f"/v1/runs/{_seg(run_id, 'run_id')}", route="/v1/runs/{run_id}")

    @staticmethod
    def events(run_id: str) -> Call:
        path = f"/v1/runs/{_seg(run_id, 'run_id')}/events"
        return Call("GET", path, route="/v1/runs/{run_id}/events")

    @staticmethod
    def follow(run_id: str, after: int) -> Call:
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        path = f"/v1/runs/{_seg(run_id, 'run_id')}/events"
        return Call("GET", path, headers=headers, route="/v1/runs/{run_id}/events")

    @staticmethod
    def cancel_run(run_id: str) -> Call:
        path = f"/v1/runs/{_seg(run_id, 'run_id')}/cancel"
        return Call("POST", path, route="/v1/runs/{run_id}/cancel")

    @staticmethod
    def retry_run(
        run_id: str, reason: str, from_node: str | None, from_start: bool, operator: str | None
    ) -> Call:
        if from_node is not None and from_start:
            raise InvalidInput("from_node and from_start: give one, not both")
        body = _action(reason, operator, from_node=from_node, from_start=from_start or None)
        path = f"/v1/runs/{_seg(run_id, 'run_id')}/retry"
        return Call("POST", path, body=body, route="/v1/runs/{run_id}/retry")

    @staticmethod
    def terminate_run(run_id: str, reason: str, operator: str | None) -> Call:
        path = f"/v1/runs/{_seg(run_id, 'run_id')}/terminate"
        body = _action(reason, operator)
        return Call("POST", path, body=body, route="/v1/runs/{run_id}/terminate")

    @staticmethod
    def extend_run(
        run_id: str, by: Duration, reason: str, node: str | None, operator: str | None
    ) -> Call:
        # D8.15: the Python API takes a duration; only the wire speaks milliseconds.
        body = _action(reason, operator, by_ms=_by_ms(by), node=node)
        path = f"/v1/runs/{_seg(run_id, 'run_id')}/extend"
        return Call("POST", path, body=body, route="/v1/runs/{run_id}/extend")

    @staticmethod
    def definitions() -> Call:
        return Call("GET", "/v1/definitions", route="/v1/definitions")

    @staticmethod
    def put_definition(definition: dict[str, Any]) -> Call:
        if not isinstance(definition, dict):
            raise InvalidInput("definition: expected a definition object")
        path = f"/v1/definitions/{_seg(definition.get('id'), 'id')}"  # type: ignore[arg-type]
        return Call("PUT", path, body=definition, route="/v1/definitions/{definition_id}")

    @staticmethod
    def operations(status: str | None, module: str | None, cursor: str | None) -> Call:
        query = _filters(status=status, module=module, cursor=cursor)
        return Call("GET", "/v1/deferred-operations", query=query, route="/v1/deferred-operations")

    @staticmethod
    def operation(op_id: str) -> Call:
        path = f"/v1/deferred-operations/{_seg(op_id, 'op_id')}"
        return Call("GET", path, route="/v1/deferred-operations/{op_id}")

    @staticmethod
    def poll(op_id: str) -> Call:
        path = f"/v1/deferred-operations/{_seg(op_id, 'op_id')}/poll"
        return Call("POST", path, route="/v1/deferred-operations/{op_id}/poll")

    @staticmethod
    def cancel_operation(op_id: str) -> Call:
        path = f"/v1/deferred-operations/{_seg(op_id, 'op_id')}/cancel"
        return Call("POST", path, route="/v1/deferred-operations/{op_id}/cancel")


# The members of a wire event that are the one event record's, beside the stored row (D10.12).
_RECORD = ("kind", "name", "epoch_ms", "correlation", "bound")


def wire_event(seq: int, raw: dict[str, Any]) -> Event:
    """Event number ``seq`` as the host sent it (a list item, an SSE message's data). From a host
    older than D10.12, which sent the stored row alone, ``name`` is ``workflow.<kind>``,
    ``epoch_ms`` the row's ``at_epoch_ms`` and ``correlation`` and ``bound`` are empty."""
    kind = str(raw.get("kind", ""))
    correlation = raw.get("correlation")
    epoch_ms = raw.get("epoch_ms", raw.get("at_epoch_ms"))
    return Event(
        seq=seq,
        kind=kind,
        data={k: v for k, v in raw.items() if k not in _RECORD},
        name=str(raw.get("name") or f"workflow.{kind}"),
        epoch_ms=epoch_ms if isinstance(epoch_ms, int) else None,
        correlation=dict(correlation) if isinstance(correlation, dict) else {},
        bound=raw.get("bound") if isinstance(raw.get("bound"), dict) else None,
    )


def numbered(events: Iterable[dict[str, Any]], start: int = 0) -> list[Event]:
    """The host's JSON event list as :class:`Event`\\ s, numbered from ``start + 1``."""
    return [wire_event(seq, raw) for seq, raw in enumerate(events, start=start + 1)]


def telemetry_event(event: Event) -> TelemetryEvent:
    """A wire event as the :class:`timebound.telemetry.Event` the host's listeners heard (D10.12):
    its ``name``, ``epoch_ms``, ``correlation``, attributes (the stored data; ``at_epoch_ms`` is
    the record's ``epoch_ms``) and ``bound`` (a :class:`~timebound.DeadlineExceeded` again).
    Only ``at``, the monotonic instant, is reconstructed (as long before now as ``epoch_ms``
    is, D10.9). A malformed bound raises :class:`~timebound.ConfigurationError` naming it."""
    epoch_ms = event["epoch_ms"]
    bound = event["bound"]
    where = f"events[{event['seq']}].bound"
    return TelemetryEvent(
        event["name"],
        at_of(epoch_ms),
        {k: v for k, v in event["data"].items() if k != "at_epoch_ms"},
        dict(event["correlation"]),
        epoch_ms,
        None if bound is None else deadline_from_problem(bound, where=where),
    )


# ---------------------------------------------------------------------------------- SSE


@dataclass
class SseMessage:
    event: str
    data: str
    id: str | None


class SseParser:
    """A Server-Sent Events parser fed line by line (the subset the host sends: ``id``,
    ``event``, ``data``; comments ignored)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> Iterator[SseMessage]:
        line = line.rstrip("\r\n")
        if not line:
            if self._data or self._event:
                yield SseMessage(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = "", [], None
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
