"""A client request run as a policy call (DECISIONS D3.17, D3.18), for every client adapter.

An adapter given ``policy=`` (a :class:`~timebound.policies.Policy`) sends each request through
:meth:`Resilience.run` (async) or :meth:`Resilience.run_sync`: the policy runs its attempts,
hedges, breaker, retry budget and learned timeout exactly as for any call (D3), and each attempt
is one whole exchange through the adapter's own deadline handling (``_client.begin``), so every
attempt and every hedge carries the caller's deadline on the wire and is cut by it.

What an attempt tells the policy (D3.17):

- an answer whose status says the dependency failed (HTTP 429/502/503/504, gRPC UNAVAILABLE and
  RESOURCE_EXHAUSTED by default): raised as :class:`FailedAnswer`, whose ``status`` and
  ``headers`` (or ``trailing_metadata()``) are where ``policies._hints`` reads the server's
  ``Retry-After`` or ``grpc-retry-pushback-ms``; its body is read and released first, so a
  retried answer holds no connection — at most ``REFUSAL_BODY_MAX`` of it (D4.14): a longer
  body is closed there, the answer keeps its first bytes and is marked :data:`TRUNCATED`;
- a connection error, or a ``DeadlineExceeded``: raised as it is; the policy tells the caller's
  spent deadline (never retried, never counted by a breaker) from the attempt's own timeout;
- any other answer is a success; any other error says nothing about the dependency and is
  handed back as :class:`Passed`, raised unchanged once the call ends (neither retried nor
  counted).

When the call ends on a failed answer (retries exhausted, a hint past the deadline, the budget
spent) that answer is the result: the adapter returns it as it would any answer (or raises it,
for gRPC), as it did before it had a policy. When it ends on an error, that error is raised:
after the last retry the last attempt's own (a note on it says how many failed), never a
``RetryExhausted`` the client never raised before; an open breaker's ``CircuitOpen`` and a
spent deadline's ``DeadlineExceeded`` as they are.

Hedging (D3.18) is chosen per request: a request whose method the user marked idempotent runs
under the policy, any other under :meth:`Policy.unhedged` (the same breaker, budget and latency
window, never hedged). A sync client's hedged request races its attempts in threads
(``policies._hedge._ThreadRace``): the race cuts a loser's deadline short, and
:meth:`Resilience.run_sync` releases every answer that did not win (its ``release``), whenever
it arrives, so no loser keeps a pooled connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from threading import Lock
from typing import Any, Final

from .._core._errors import ConfigurationError, RetryExhausted
from ..policies._options import MISSING
from ..policies._policy import Policy

__all__ = [
    "DEFAULT_HEDGE_METHODS",
    "DEFAULT_RETRY_STATUSES",
    "TRUNCATED",
    "FailedAnswer",
    "Passed",
    "Resilience",
    "check_grpc_methods",
    "check_http_methods",
    "check_policy",
    "check_statuses",
    "mark_truncated",
]

#: HTTP answers that are the dependency's failure by default (Polly v8's HttpClient handler:
#: 429, and the 5xx of a gateway or a shedding server).
DEFAULT_RETRY_STATUSES: Final = frozenset({429, 502, 503, 504})
#: The methods hedged by default: safe ones (RFC 9110 §9.2.1).
DEFAULT_HEDGE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: The methods that may be hedged at all: idempotent ones (RFC 9110 §9.2.2).
IDEMPOTENT_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


#: The attribute set to ``True`` on a failed answer whose body passed ``REFUSAL_BODY_MAX``
#: (D4.14): its body holds the first that many bytes only, its connection was closed.
TRUNCATED: Final = "timebound_truncated"


def mark_truncated(answer: object) -> None:
    """Say on a failed answer that its body was cut at ``REFUSAL_BODY_MAX`` (D4.14)."""
    setattr(answer, TRUNCATED, True)


class FailedAnswer(Exception):
    """An answer whose status says the dependency failed; ``answer`` is what the adapter returns
    (or raises) when the call ends on it. ``status``/``headers`` (HTTP) or
    ``trailing_metadata()`` (gRPC) carry the server's retry hint (D3.11)."""

    def __init__(
        self,
        answer: Any,
        what: str,
        *,
        status: int | None = None,
        headers: Any = None,
        trailing: Any = None,
    ) -> None:
        super().__init__(f"{what} answered {status if status is not None else 'a failure'}")
        self.answer = answer
        self.status = status
        self.headers = headers
        self._trailing = trailing

    def trailing_metadata(self) -> Any:
        return self._trailing


@dataclass(frozen=True, slots=True)
class Passed:
    """An error of an attempt that says nothing about the dependency: raised after the call."""

    error: BaseException


def _settle(value: Any) -> Any:
    if isinstance(value, Passed):
        raise value.error
    return value


def _answer_of(exc: Exception) -> Any:
    """The failed answer the call ended on; else raise the error it ended with: the last
    attempt's own when retries ran out (the client library's error, as without a policy, with
    a note saying how many attempts failed), ``exc`` otherwise."""
    if isinstance(exc, RetryExhausted) and exc.errors:
        last = exc.errors[-1]
        if not isinstance(last, FailedAnswer):
            last.add_note(str(exc))
            raise last
        exc = last
    if isinstance(exc, FailedAnswer):
        return exc.answer
    raise exc


@dataclass(frozen=True, slots=True)
class Resilience:
    """A client's policy, its unhedged twin and the requests it may hedge (by method)."""

    policy: Policy[Any]
    unhedged: Policy[Any]
    hedged: frozenset[str]

    def policy_for(self, method: str) -> Policy[Any]:
        """The policy of a request: hedged only when its method is marked idempotent."""
        return self.policy if method in self.hedged else self.unhedged

    async def run(self, method: str, attempt: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """The request's answer after the policy's attempts (see the module documentation)."""
        try:
            value = await self.policy_for(method).execute(attempt, args)
        except Exception as exc:
            return _answer_of(exc)
        return _settle(value)

    def run_sync(
        self,
        method: str,
        attempt: Callable[..., Any],
        *args: Any,
        release: Callable[[Any], None] | None = None,
    ) -> Any:
        """:meth:`run` for a sync client. A hedged request's attempts race in threads; every
        answer but the one returned is given to ``release`` (its connection back to the pool),
        at once or, for a loser still running, when it ends (D3.18)."""
        policy = self.policy_for(method)
        losers = None if release is None or policy is self.unhedged else _Losers(release)
        try:
            if losers is None:
                value = policy.execute_sync(attempt, args)
            else:
                value = policy.execute_sync(losers.attempt, (attempt, *args))
        except Exception as exc:
            if losers is not None:
                losers.decide(None)
            return _answer_of(exc)
        if losers is not None:
            losers.decide(value)
        return _settle(value)


class _Losers:
    """The answers of one hedged sync request: once the call returned, each one that is not
    the result is released, those still to come as they arrive (the race drops them unread)."""

    __slots__ = ("_answers", "_decided", "_lock", "_release", "_result")

    def __init__(self, release: Callable[[Any], None]) -> None:
        self._release = release
        self._lock = Lock()
        self._answers: list[Any] = []
        self._decided = False
        self._result: Any = None

    def attempt(self, attempt: Callable[..., Any], *args: Any) -> Any:
        value = attempt(*args)
        if isinstance(value, Passed):
            return value
        with self._lock:
            late = self._decided and value is not self._result
            if not late:
                self._answers.append(value)
        if late:
            self._release(value)
        return value

    def decide(self, result: Any) -> None:
        with self._lock:
            self._decided = True
            self._result = result
            answers, self._answers = self._answers, []
        for value in answers:
            if value is not result:
                self._release(value)


def check_policy(
    policy: Any, *, adapter: str, hedged: frozenset[str], hedging: str | None
) -> Resilience | None:
    """Validate a client's ``policy=``; ``hedging`` says why this client cannot hedge (``None``:
    it can). Options that would make the call's result something other than an answer are
    refused: a client must hand back the answer or the error (D3.17)."""
    if policy is None:
        return None
    if not isinstance(policy, Policy):
        raise ConfigurationError(
            f"{adapter}: policy must be a timebound.policies.Policy, got {type(policy).__name__}",
            option="policy",
        )
    refused = [
        (policy.fallback is not MISSING, "fallback"),
        (policy.cache is not None, "cache"),
        (policy.on_error != "propagate", f"on_error={policy.on_error!r}"),
    ]
    for bad, what in refused:
        if bad:
            raise ConfigurationError(
                f"{adapter}: the policy {policy.name!r} has {what}; a client returns the answer "
                "or raises the error, so its policy takes attempts, hedging, a breaker and a "
                f"retry budget only (put {what} around the call instead)",
                option="policy",
            )
    if policy.hedge is not None and hedging is not None:
        raise ConfigurationError(
            f"{adapter} cannot hedge: {hedging}; give it a policy without hedge=",
            option="policy",
        )
    return Resilience(policy, policy.unhedged(), hedged)


def check_statuses(statuses: Iterable[int], *, option: str = "retry_statuses") -> frozenset[int]:
    """HTTP statuses that are the dependency's failure: integers 100-599."""
    out = frozenset(_iterable(statuses, option))
    for status in out:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ConfigurationError(
                f"{option}: an HTTP status is an integer 100-599, got {status!r}", option=option
            )
    return out


def check_http_methods(methods: Iterable[str], *, option: str = "hedge_methods") -> frozenset[str]:
    """The HTTP methods to hedge: idempotent ones only (RFC 9110 §9.2.2), in any case."""
    out = set()
    for method in _iterable(methods, option):
        if not isinstance(method, str) or method.upper() not in IDEMPOTENT_METHODS:
            raise ConfigurationError(
                f"{option}: only idempotent methods may be hedged "
                f"({', '.join(sorted(IDEMPOTENT_METHODS))}), got {method!r}",
                option=option,
            )
        out.add(method.upper())
    return frozenset(out)


def check_grpc_methods(methods: Iterable[str], *, option: str = "hedge_methods") -> frozenset[str]:
    """The gRPC methods the user marks idempotent, as ``/pkg.Service/Method`` paths."""
    out = set()
    for method in _iterable(methods, option):
        if not isinstance(method, str) or "/" not in method.strip("/"):
            raise ConfigurationError(
                f"{option}: a gRPC method is '/package.Service/Method', got {method!r}",
                option=option,
            )
        out.add("/" + method.strip("/"))
    return frozenset(out)


def _iterable(values: Any, option: str) -> Iterable[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigurationError(
            f"{option} must be a collection (a set or a tuple), got {values!r}", option=option
        )
    return values
