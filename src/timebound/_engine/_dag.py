"""The shared DAG executor: nodes, groups that own a deadline, failure policies, lifecycle events.

Shared machinery below the engines: the Constellation runtime and the pipeline engine run on it.
It runs on asyncio and on trio through a seam of three points (spawn a node, wait for one to
finish, tear down the rest): asyncio tasks on asyncio, a nursery on trio; everything else (ready
queue, groups, policies, events) is shared. anyio's task groups were the first choice, but
measured on the Constellation fan-out (bench/dsl.py, 50 concurrent calls) their ``start_soon``
cost 3.6x ``asyncio.gather`` against 1.05x for plain tasks, and their cancel scopes re-deliver a
cancellation at every await where asyncio code expects it once (a node's ``finally: await
cleanup()`` would be cut); anyio would also have become a dependency of the base install. A run
that never needs a second task opens no nursery at all.

Semantics:

* A node becomes ready when all its dependencies completed. Sync nodes (``is_async=False``) run
  inline the moment they are ready and never take a concurrency slot (they cannot wait).
* Ready async nodes start in priority order (higher first, then declaration order) while fewer
  than ``concurrency`` async nodes run. Priority only orders; it never preempts or cancels.
* When exactly one async node is ready and nothing runs, it is awaited in place instead of in a
  new task: a chain of dependent calls pays no task creation per step.
* A node's failure policy (``on_error``, else its group's, else ``"fail"``):

  - ``"fail"`` (fail-fast): the run fails; every running node is cancelled and awaited (nothing is
    left running), then that node's own exception is raised unchanged (the failing node is
    available as ``exc.__timebound_node__``);
  - ``"collect"``: the exception is stored in ``errors[key]``, the node's dependents are skipped,
    the rest of the run goes on.

* A :class:`Group` is a region: its deadline starts when the group is entered (all its external
  dependencies done, D5.4) and is a timebound scope with the group's ``source`` (``"region"`` by
  default) around every member, so a member sees the minimum of its own, its groups' and every
  enclosing deadline (D1.5). Dependencies that cross a group's boundary go through the group: a
  node outside a group that depends on a member waits for the whole group to settle.
  When the group's own deadline fires (the group's scope itself reports it, so an outer deadline
  or a cancellation is never mistaken for it, D2.2), its members that did not finish are
  interrupted or never started, and ``on_timeout`` decides: ``"fail"`` raises the region's
  :class:`~timebound.DeadlineExceeded`, ``"collect"`` stores it in ``errors[group key]`` and skips
  the group's dependents, a callable is the group's fallback: it runs once, outside the expired
  region but under every enclosing bound (D5.2; an enclosing region that runs out cuts it), and
  its value is stored as ``results[group key]``. A value a member produced after the group's
  deadline is discarded (outcome ``"late"``). ``on_enter``/``on_success`` bracket a group that
  settles in time (a transaction's begin and commit); a group whose enclosing region ran out
  before its turn is never entered: no hook, no fallback.
* Events: ``sink(Event)`` receives ``ready``/``start``/``end`` for every node and group, with
  the outcome at ``end`` (``ok``, ``error``, ``cancelled``, ``skipped``, ``timed_out``, ``late``).
  ``record=True`` returns the same as :class:`Span` objects (nodes in declaration order, then
  groups; ``record=`` a list keeps them even when the run fails); :meth:`DagPlan.critical_path`
  walks them back from the last node to finish.

Node and group keys are the caller's (stable across edits of the definition); the executor
never invents identities.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from .._core import _clock
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from .._core._scopes import CancelScope, move_on_at

__all__ = ["DagPlan", "Event", "Group", "Node", "Span"]

_C = TypeVar("_C")

ErrorPolicy = Literal["fail", "collect"]


@dataclass(frozen=True, slots=True)
class Node(Generic[_C]):
    """One unit of work. ``action(ctx)`` returns an awaitable when ``is_async``, else the value
    itself; with ``execute(..., results=d)`` each node's value is stored as ``d[key]``.
    ``group`` names the :class:`Group` the node belongs to; ``on_error`` overrides the group's
    failure policy."""

    key: Hashable
    action: Callable[[_C], Any]
    deps: tuple[Hashable, ...] = ()
    priority: int = 50
    is_async: bool = True
    group: Hashable | None = None
    on_error: ErrorPolicy | None = None


@dataclass(frozen=True, slots=True)
class Group(Generic[_C]):
    """A region of nodes that owns a deadline and a failure policy.

    ``timeout`` is in seconds from the moment the group is entered, or a function of the run's
    context called at that moment (a budget that depends on the input), or ``None`` (no deadline
    of its own). ``parent`` nests groups. ``on_timeout`` is ``"fail"``, ``"collect"`` or a
    fallback ``fallback(ctx)`` (sync or async). ``on_error`` is the members' default policy.
    ``deps`` are nodes or groups the group waits for before it is entered (a node may also
    depend on a group: it waits for the group to settle). ``on_enter(ctx)`` runs when the group
    is entered (before ``timeout`` is computed); ``on_success(ctx)`` when it settled in time
    (every member done before its deadline) -- e.g. to begin and commit a transaction.
    """

    key: Hashable
    timeout: float | Callable[[_C], float | None] | None = None
    parent: Hashable | None = None
    on_timeout: Literal["fail", "collect"] | Callable[[_C], Any] = "fail"
    on_error: ErrorPolicy = "fail"
    source: str = "region"
    deps: tuple[Hashable, ...] = ()
    on_enter: Callable[[_C], None] | None = None
    on_success: Callable[[_C], None] | None = None


@dataclass(slots=True)
class Span:
    """When a node (or group) became ready, started and ended (monotonic seconds, ``_clock``)."""

    key: Hashable
    ready: float
    start: float = 0.0
    end: float = 0.0
    outcome: str = "pending"  # ok | error | cancelled | skipped | timed_out | late | pending
    group: Hashable | None = None  # the enclosing group's key
    is_group: bool = False


class Event(NamedTuple):
    """One lifecycle event: ``kind`` is ``ready``, ``start`` or ``end``; ``outcome`` at ``end``.

    (A named tuple: one is built per node per phase, on the traced path.)
    """

    kind: str
    key: Hashable
    at: float
    outcome: str | None = None
    group: Hashable | None = None
    is_group: bool = False


# Internal node kinds: user nodes first, then for each group an "enter" and an "exit" node.
_USER, _ENTER, _EXIT = 0, 1, 2


class _Exec:
    """The state of one execution (a plain class: built once per run, on the hot path)."""

    __slots__ = (
        "cancelled",
        "errors",
        "failure",
        "finished",
        "g_deadline",
        "g_timed_out",
        "g_timeout",
        "loop",
        "native",
        "poisoned",
        "ready",
        "remaining",
        "results",
        "running",
        "sink",
        "spans",
        "sync_ready",
        "tg",
        "waiter",
    )

    def __init__(
        self, remaining: list[int], sync_ready: list[int], ready: list[tuple[int, int]]
    ) -> None:
        self.remaining = remaining
        self.sync_ready = sync_ready
        self.ready = ready  # heap of (-priority, index)
        self.running = 0
        self.finished: list[tuple[int, bool, Any]] = []
        self.waiter: Any = None  # asyncio: a Future; trio: a trio.Event
        self.spans: list[Span] | None = None
        self.results: dict[Any, Any] | None = None
        self.errors: dict[Any, BaseException] | None = None
        self.sink: Callable[[Event], None] | None = None
        self.failure: BaseException | None = None
        self.tg: Any = None  # trio: the nursery holding the running nodes
        self.cancelled: type[BaseException] = asyncio.CancelledError
        # asyncio only: the running nodes' tasks
        self.native: dict[int, asyncio.Task[Any]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poisoned: set[int] | None = None
        self.g_deadline: list[float] = []
        self.g_timeout: list[float | None] = []
        self.g_timed_out: list[bool] = []


class _NeedTaskGroup(Exception):
    """Internal: the run needs a second task; re-enter the loop inside a task group."""


class DagPlan(Generic[_C]):
    """A validated graph of nodes (and groups), built once and executed any number of times."""

    def __init__(self, nodes: Sequence[Node[_C]], groups: Sequence[Group[_C]] = ()) -> None:
        self.nodes: tuple[Node[_C], ...] = tuple(nodes)
        self.groups: tuple[Group[_C], ...] = tuple(groups)
        n_user = len(self.nodes)
        gindex: dict[Hashable, int] = {}
        for gi, grp in enumerate(self.groups):
            if grp.key in gindex:
                raise ValueError(f"duplicate group key {grp.key!r}")
            gindex[grp.key] = gi
            if not (grp.on_timeout in ("fail", "collect") or callable(grp.on_timeout)):
                raise ValueError(
                    f"group {grp.key!r}: on_timeout must be 'fail', 'collect' or a fallback"
                )
        gparent = [-1] * len(self.groups)
        for gi, grp in enumerate(self.groups):
            if grp.parent is not None:
                p = gindex.get(grp.parent)
                if p is None:
                    raise ValueError(f"group {grp.key!r} has unknown parent group {grp.parent!r}")
                gparent[gi] = p
        self._gchain = [self._chain_of(gi, gparent) for gi in range(len(self.groups))]
        index: dict[Hashable, int] = {}
        for i, n in enumerate(self.nodes):
            if n.key in index:
                raise ValueError(f"duplicate node key {n.key!r}")
            if n.group is not None and n.group not in gindex:
                raise ValueError(f"node {n.key!r} is in unknown group {n.group!r}")
            index[n.key] = i
        # Internal index space: user nodes, then enter/exit of every group.
        total = n_user + 2 * len(self.groups)
        self._kind = [_USER] * n_user + [_ENTER, _EXIT] * len(self.groups)
        self._gof = [0] * total  # user nodes: their group (-1 none); enter/exit: the group itself
        # the groups whose scopes surround an internal node, outermost first
        self._chain: list[tuple[int, ...]] = []
        for n in self.nodes:
            ng = -1 if n.group is None else gindex[n.group]
            self._chain.append(self._gchain[ng] if ng >= 0 else ())
        for i in range(n_user):
            n = self.nodes[i]
            self._gof[i] = -1 if n.group is None else gindex[n.group]
        for gi in range(len(self.groups)):
            self._gof[self._enter(gi)] = gi
            self._gof[self._exit(gi)] = gi
            outer = self._gchain[gi][:-1]
            self._chain.append(outer)  # enter
            self._chain.append(outer)  # exit (the fallback runs outside the group's own scope)
        edges: set[tuple[int, int]] = set()

        def endpoint(d: Hashable, who: Hashable) -> tuple[int, tuple[int, ...]]:
            """A dependency named ``d``: a node, or a group (then its exit)."""
            j = index.get(d)
            if j is not None:
                return j, self._chain[j]
            g = gindex.get(d)
            if g is None:
                raise ValueError(f"{who!r} depends on unknown node {d!r}")
            return self._exit(g), self._gchain[g]

        def link(src: int, theirs: tuple[int, ...], tgt: int, mine: tuple[int, ...]) -> None:
            for g in theirs:  # the outermost group holding the dependency but not us
                if g not in mine:
                    src = self._exit(g)
                    break
            for g in mine:  # the outermost group holding us but not the dependency
                if g not in theirs:
                    tgt = self._enter(g)
                    break
            edges.add((src, tgt))

        for i, n in enumerate(self.nodes):
            for d in n.deps:
                src, theirs = endpoint(d, n.key)
                if src >= n_user and self._gof[src] in self._chain[i]:
                    raise ValueError(f"node {n.key!r} depends on its own group {d!r}")
                link(src, theirs, i, self._chain[i])
        for gi, grp in enumerate(self.groups):
            for d in grp.deps:
                src, theirs = endpoint(d, grp.key)
                if (src < n_user and gi in self._chain[src]) or (
                    src >= n_user and gi in self._gchain[self._gof[src]]
                ):
                    raise ValueError(f"group {grp.key!r} depends on its own member {d!r}")
                link(src, theirs, self._enter(gi), self._gchain[gi])
        for gi in range(len(self.groups)):
            enter, exit_ = self._enter(gi), self._exit(gi)
            edges.add((enter, exit_))
            p = gparent[gi]
            if p >= 0:
                edges.add((self._enter(p), enter))
                edges.add((exit_, self._exit(p)))
        for i in range(n_user):
            g = self._gof[i]
            if g >= 0:
                edges.add((self._enter(g), i))
                edges.add((i, self._exit(g)))
        self._deps: list[list[int]] = [[] for _ in range(total)]
        self._dependents: list[list[int]] = [[] for _ in range(total)]
        self._indegree: list[int] = [0] * total
        for src, tgt in sorted(edges):
            self._dependents[src].append(tgt)
            self._deps[tgt].append(src)
            self._indegree[tgt] += 1
        self._async = [n.is_async for n in self.nodes] + [False, False] * len(self.groups)
        for gi, grp in enumerate(self.groups):
            # An exit with a fallback may wait; everything else about groups is bookkeeping.
            self._async[self._exit(gi)] = callable(grp.on_timeout)
        self._policy: list[ErrorPolicy] = []
        for n in self.nodes:
            ng = -1 if n.group is None else gindex[n.group]
            default: ErrorPolicy = self.groups[ng].on_error if ng >= 0 else "fail"
            self._policy.append(n.on_error or default)
        self._roots = [i for i, d in enumerate(self._indegree) if d == 0]
        # Ready-queue entries, built once: higher priority first, then declaration order.
        self._entries = [(-n.priority, i) for i, n in enumerate(self.nodes)] + [
            (-50, i) for i in range(n_user, total)
        ]
        self._keys: list[Hashable] = [n.key for n in self.nodes]
        for grp in self.groups:
            self._keys += [grp.key, grp.key]
        self._n_user = n_user
        self._plain = not self.groups and all(p == "fail" for p in self._policy)
        self._async_roots = sorted(self._entries[i] for i in self._roots if self._async[i])
        # popped from the end: reverse declaration order keeps sync roots in declaration order
        self._sync_roots = [i for i in reversed(self._roots) if not self._async[i]]
        self._check_acyclic()

    def _enter(self, gi: int) -> int:
        return len(self.nodes) + 2 * gi

    def _exit(self, gi: int) -> int:
        return len(self.nodes) + 2 * gi + 1

    @staticmethod
    def _chain_of(gi: int, parent: list[int]) -> tuple[int, ...]:
        chain: list[int] = []
        g = gi
        while g >= 0:
            if g in chain:
                raise ValueError("group nesting has a cycle")
            chain.append(g)
            g = parent[g]
        return tuple(reversed(chain))

    def _check_acyclic(self) -> None:
        indeg = list(self._indegree)
        stack = list(self._roots)
        seen = 0
        while stack:
            i = stack.pop()
            seen += 1
            for j in self._dependents[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    stack.append(j)
        if seen != len(indeg):
            cyclic = sorted(
                {self._keys[i] for i, d in enumerate(indeg) if d > 0}, key=lambda k: repr(k)
            )
            raise ValueError(f"dependency cycle among nodes {cyclic!r}")

    # Running ----------------------------------------------------------------------------

    async def execute(
        self,
        ctx: _C,
        *,
        concurrency: int | None = None,
        record: bool | list[Span] = False,
        results: dict[Any, Any] | None = None,
        errors: dict[Any, BaseException] | None = None,
        sink: Callable[[Event], None] | None = None,
    ) -> list[Span] | None:
        """Run every node once; returns the spans (nodes, then groups) when ``record`` is true.
        ``record`` may also be a list: the spans are added to it when the run starts, so the
        caller has them even when the run fails.

        With ``results``, each node's value is stored there under its key as it completes (and a
        group fallback's value under the group's key); ``errors`` receives what ``collect``
        policies collected (a collected error is never raised). ``sink`` receives every
        lifecycle :class:`Event`.
        """
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        st = _Exec(self._indegree.copy(), self._sync_roots.copy(), self._async_roots.copy())
        st.results = results
        st.sink = sink
        if not self._plain:
            st.errors = errors if errors is not None else {}
            st.poisoned = set()
            ng = len(self.groups)
            st.g_deadline = [_INF] * ng
            st.g_timeout = [None] * ng
            st.g_timed_out = [False] * ng
        if record is not False or sink is not None:
            now = _clock.now()
            spans = [Span(n.key, now, group=n.group) for n in self.nodes]
            spans += [Span(g.key, now, group=g.parent, is_group=True) for g in self.groups]
            st.spans = spans
            if isinstance(record, list):
                record.extend(spans)
            if sink is not None:
                for i in self._roots:
                    self._emit(st, "ready", i, now)
        loop = asyncio._get_running_loop()
        if loop is not None:
            st.native = {}
            st.loop = loop
        else:
            st.cancelled = _trio().Cancelled
        try:
            await self._loop(st, ctx, concurrency)
        except _NeedTaskGroup:  # trio: a nursery holds the running nodes
            async with _trio().open_nursery() as nursery:
                st.tg = nursery
                try:
                    await self._loop(st, ctx, concurrency)
                finally:
                    if st.failure is not None or st.running:
                        nursery.cancel_scope.cancel()
        except BaseException:
            if st.native:
                await self._teardown(st)
            raise
        if st.failure is not None and st.native:
            await self._teardown(st)
        if st.failure is not None:
            raise st.failure
        return st.spans if record is not False else None

    def _span(self, st: _Exec, i: int) -> Span:
        assert st.spans is not None
        if i < self._n_user:
            return st.spans[i]
        return st.spans[self._n_user + self._gof[i]]

    def _emit(self, st: _Exec, kind: str, i: int, at: float, outcome: str | None = None) -> None:
        sink = st.sink
        if sink is None or self._kind[i] == (_EXIT if kind != "end" else _ENTER):
            # A group's ready/start come from its enter node, its end from its exit node.
            return
        span = self._span(st, i)
        sink(Event(kind, span.key, at, outcome, span.group, span.is_group))

    def _start(self, st: _Exec, i: int) -> None:
        spans = st.spans
        if spans is not None:
            now = _clock.now()
            if i < self._n_user:
                spans[i].start = now
            elif self._kind[i] == _ENTER:
                spans[self._n_user + self._gof[i]].start = now
            if st.sink is not None:
                self._emit(st, "start", i, now)

    def _end(self, st: _Exec, i: int, outcome: str) -> None:
        spans = st.spans
        if spans is not None:
            now = _clock.now()
            if i < self._n_user:
                span = spans[i]
            elif self._kind[i] == _EXIT:
                span = spans[self._n_user + self._gof[i]]
            else:
                span = None
            if span is not None:
                span.end = now
                span.outcome = outcome
            if st.sink is not None:
                self._emit(st, "end", i, now, outcome)

    def _complete(self, st: _Exec, i: int, poison: bool = False) -> None:
        remaining = st.remaining
        spans = st.spans
        now = _clock.now() if spans is not None else 0.0
        if poison:
            assert st.poisoned is not None
            st.poisoned.update(self._dependents[i])
        for j in self._dependents[i]:
            remaining[j] -= 1
            if remaining[j] == 0:
                if spans is not None:
                    if self._kind[j] != _EXIT:
                        self._span(st, j).ready = now
                    self._emit(st, "ready", j, now)
                if self._async[j]:
                    heapq.heappush(st.ready, self._entries[j])
                else:
                    st.sync_ready.append(j)

    def _blocked(self, st: _Exec, i: int) -> str | None:
        """Why node ``i`` must not run (skipped, or its region's deadline passed), else None."""
        if st.poisoned is None:
            return None
        if i in st.poisoned and self._kind[i] == _USER:
            return "skipped"
        chain = self._chain[i]
        if chain:
            now = _clock.now()
            for g in chain:
                if st.g_timed_out[g]:
                    return "skipped"
                if now >= st.g_deadline[g]:  # never early: reached only at clock() >= deadline
                    st.g_timed_out[g] = True
                    return "timed_out"
        return None

    def _fail(self, st: _Exec, i: int, exc: BaseException) -> bool:
        """Record node ``i``'s failure; true when the run must stop."""
        _mark(exc, self._keys[i])
        cancel = isinstance(exc, st.cancelled)
        if i < self._n_user and self._policy[i] == "collect" and not cancel:
            assert st.errors is not None
            st.errors[self._keys[i]] = exc
            self._end(st, i, "error")
            self._complete(st, i, poison=True)
            return False
        self._end(st, i, "cancelled" if cancel else "error")
        st.failure = exc
        return True

    def _run_sync(self, st: _Exec, ctx: _C, i: int) -> bool:
        """Run a sync (or bookkeeping) node inline; true when the run must stop."""
        kind = self._kind[i]
        if kind != _USER:
            if self._blocked(st, i) is not None:
                # An enclosing region ran out: this group is never entered (its members are
                # skipped through the poison) or settles as skipped -- no hooks, no fallback.
                if kind == _EXIT:
                    self._end(st, i, "skipped")
                self._complete(st, i, poison=kind == _ENTER)
                return False
            if kind == _ENTER:
                return self._enter_group(st, ctx, i)
            return self._exit_group(st, ctx, i, None)
        why = self._blocked(st, i) if st.poisoned or self._chain[i] else None
        if why is not None:
            self._end(st, i, why)
            self._complete(st, i, poison=why == "skipped" and i in (st.poisoned or ()))
            return False
        self._start(st, i)
        chain = self._chain[i]
        try:
            if chain:
                scopes = self._scopes(st, chain)
                value = _run_in_scopes(scopes, self.nodes[i].action, ctx)
                if self._expired(st, scopes):
                    self._end(st, i, "late")
                    self._complete(st, i)
                    return False
            else:
                value = self.nodes[i].action(ctx)
        except BaseException as exc:
            return self._fail(st, i, exc)
        if st.results is not None:
            st.results[self._keys[i]] = value
        self._end(st, i, "ok")
        self._complete(st, i)
        return False

    def _enter_group(self, st: _Exec, ctx: _C, i: int) -> bool:
        g = self._gof[i]
        group = self.groups[g]
        self._start(st, i)
        if st.poisoned is not None and i in st.poisoned:
            # Never entered: the poison reaches every member, then the exit and its dependents.
            self._complete(st, i, poison=True)
            return False
        timeout = group.timeout
        try:
            if group.on_enter is not None:
                group.on_enter(ctx)
            seconds = timeout(ctx) if callable(timeout) else timeout
        except BaseException as exc:
            return self._fail(st, i, exc)
        if seconds is not None:
            st.g_timeout[g] = seconds
            st.g_deadline[g] = _clock.now() + max(0.0, seconds)
        self._complete(st, i)
        return False

    async def _fallback(self, group: Group[_C], ctx: _C) -> Any:
        on_timeout = group.on_timeout
        assert callable(on_timeout)
        value = on_timeout(ctx)
        if inspect.isawaitable(value):
            value = await value
        return value

    def _exit_group(self, st: _Exec, ctx: _C, i: int, fallback: tuple[bool, Any] | None) -> bool:
        """Settle group ``i``; ``fallback`` is (True, its value) when one ran, or (False,
        outcome) when an enclosing region's deadline cut it."""
        g = self._gof[i]
        group = self.groups[g]
        poisoned = st.poisoned is not None and i in st.poisoned
        if not st.g_timed_out[g]:
            if not poisoned and group.on_success is not None:
                try:
                    group.on_success(ctx)
                except BaseException as exc:
                    return self._fail(st, i, exc)
            self._end(st, i, "skipped" if poisoned else "ok")
            self._complete(st, i, poison=poisoned)
            return False
        if fallback is not None:
            ok, value = fallback
            if not ok:
                # The enclosing region timed out too; its own exit decides what happens.
                self._end(st, i, value)
                self._complete(st, i)
                return False
            if st.results is not None:
                st.results[group.key] = value
            self._end(st, i, "timed_out")
            self._complete(st, i)
            return False
        error = DeadlineExceeded(
            source=group.source,
            timeout=st.g_timeout[g],
            deadline=Deadline(st.g_deadline[g]),
            what=f"group {group.key!r}",
        )
        _mark(error, group.key)
        self._end(st, i, "timed_out")
        if group.on_timeout == "collect":
            assert st.errors is not None
            st.errors[group.key] = error
            self._complete(st, i, poison=True)
            return False
        st.failure = error
        return True

    def _scopes(self, st: _Exec, chain: tuple[int, ...]) -> list[tuple[int, CancelScope]]:
        return [
            (g, move_on_at(Deadline(st.g_deadline[g]), source=self.groups[g].source))
            for g in chain
            if st.g_deadline[g] != _INF
        ]

    def _expired(self, st: _Exec, scopes: list[tuple[int, CancelScope]]) -> bool:
        # The scope itself reports whether ITS deadline fired (D2.2); the outermost one that
        # did is the region that timed out.
        for g, scope in scopes:
            if scope.expired:
                st.g_timed_out[g] = True
                return True
        return False

    async def _run_async(self, st: _Exec, ctx: _C, i: int) -> tuple[bool, Any]:
        """Run async node ``i``: (True, value) or (False, outcome) when it produced nothing."""
        chain = self._chain[i]
        if self._kind[i] == _EXIT:
            # A fallback runs outside its own expired region, inside the enclosing ones.
            group = self.groups[self._gof[i]]
            action: Callable[[_C], Any] = functools.partial(self._fallback, group)
        else:
            action = self.nodes[i].action
        if not chain:
            return True, await action(ctx)
        scopes = self._scopes(st, chain)
        value = await _arun_in_scopes(scopes, action, ctx)
        if self._expired(st, scopes):
            return False, "late" if value is not _NOTHING else "timed_out"
        return True, value

    def _settle_async(self, st: _Exec, ctx: _C, i: int, ok: bool, value: Any) -> bool:
        """Book the outcome of async node ``i``; true when the run must stop."""
        if self._kind[i] == _EXIT:
            return self._exit_group(st, ctx, i, (ok, value))
        if not ok:
            self._end(st, i, value)
            self._complete(st, i)
            return False
        if st.results is not None:
            st.results[self._keys[i]] = value
        self._end(st, i, "ok")
        self._complete(st, i)
        return False

    async def _loop(self, st: _Exec, ctx: _C, concurrency: int | None) -> None:
        # The per-node path for plans without groups or collect policies is written out with
        # locals: it is what every Constellation call pays (bench/dsl.py).
        nodes = self.nodes
        dependents = self._dependents
        entries = self._entries
        is_async = self._async
        remaining = st.remaining
        ready = st.ready
        sync_ready = st.sync_ready
        results = st.results
        keys = self._keys
        plain = self._plain and st.spans is None
        heappush = heapq.heappush
        heappop = heapq.heappop
        cancelled = st.cancelled
        aloop = st.loop
        native: dict[int, asyncio.Task[Any]] = st.native if st.native is not None else {}
        while True:
            while sync_ready:
                i = sync_ready.pop()
                if plain:
                    try:
                        value = nodes[i].action(ctx)
                    except BaseException as exc:
                        _mark(exc, keys[i])
                        st.failure = exc
                        return
                    if results is not None:
                        results[keys[i]] = value
                    self._complete(st, i)
                elif self._run_sync(st, ctx, i):
                    return
            while ready and (concurrency is None or st.running < concurrency):
                entry = heappop(ready)
                i = entry[1]
                if not plain:
                    why = self._blocked(st, i)
                    if why is not None:
                        self._end(st, i, why)
                        poison = why == "skipped" and i in (st.poisoned or ())
                        self._complete(st, i, poison=poison and self._kind[i] != _EXIT)
                        continue
                    if self._kind[i] == _EXIT and not st.g_timed_out[self._gof[i]]:
                        # in time (or never entered): the fallback is not needed
                        if self._exit_group(st, ctx, i, None):
                            return
                        continue
                if st.running or ready:
                    if aloop is not None:
                        self._start(st, i)
                        st.running += 1
                        native[i] = aloop.create_task(self._spawned(st, ctx, i))
                        continue
                    if st.tg is None:
                        heappush(ready, entry)
                        raise _NeedTaskGroup
                    self._start(st, i)
                    st.running += 1
                    st.tg.start_soon(self._spawned, st, ctx, i)
                    continue
                # The only thing to do: await it here, no task needed.
                if plain:
                    try:
                        value = await nodes[i].action(ctx)
                    except cancelled:
                        raise
                    except BaseException as exc:
                        _mark(exc, keys[i])
                        st.failure = exc
                        return
                    if results is not None:
                        results[keys[i]] = value
                    for j in dependents[i]:  # _complete() written out: the untraced path
                        remaining[j] -= 1
                        if remaining[j] == 0:
                            if is_async[j]:
                                heappush(ready, entries[j])
                            else:
                                sync_ready.append(j)
                else:
                    self._start(st, i)
                    try:
                        ok, value = await self._run_async(st, ctx, i)
                    except cancelled:
                        self._end(st, i, "cancelled")
                        raise
                    except BaseException as exc:
                        if self._fail(st, i, exc):
                            return
                        break
                    if self._settle_async(st, ctx, i, ok, value):
                        return
                break  # sync nodes may have become ready: handle them first
            else:
                if not st.running:
                    if not sync_ready and not ready:
                        return
                    continue
                if not st.finished:
                    await _wait(st)
                if self._drain(st, ctx):
                    return

    async def _teardown(self, st: _Exec) -> None:
        """asyncio: cancel every running node once and wait for all of them, so nothing outlives
        the run (a node may await its cleanup, as asyncio code expects). On trio the task
        group's own cancel scope does this."""
        native = st.native
        assert native is not None
        for task in list(native.values()):
            task.cancel()
        while st.running:
            if not st.finished:
                await _wait(st)
            st.running -= len(st.finished)
            for i, _, _ in st.finished:
                self._end(st, i, "cancelled")
            st.finished.clear()

    async def _spawned(self, st: _Exec, ctx: _C, i: int) -> None:
        try:
            ok, value = await self._run_async(st, ctx, i)
        except BaseException as exc:
            tg = st.tg
            if tg is not None and tg.cancel_scope.cancel_called and isinstance(exc, st.cancelled):
                self._end(st, i, "cancelled")
                raise  # trio: the run is being torn down by its nursery
            # Cancelled by someone other than the run, or a failure: the run decides.
            self._finish(st, i, False, exc)
            return
        self._finish(st, i, True, (ok, value))

    def _finish(self, st: _Exec, i: int, ok: bool, payload: Any) -> None:
        if st.native is not None:
            st.native.pop(i, None)
        st.finished.append((i, ok, payload))
        w = st.waiter
        if w is not None:
            if st.loop is None:
                w.set()
            elif not w.done():
                w.set_result(None)

    def _drain(self, st: _Exec, ctx: _C) -> bool:
        finished = st.finished
        while finished:
            i, ok, payload = finished.pop(0)
            st.running -= 1
            if not ok:
                if self._plain and st.spans is None:
                    _mark(payload, self._keys[i])
                    st.failure = payload
                    return True
                if self._fail(st, i, payload):
                    return True
                continue
            done, value = payload
            if self._plain and st.spans is None:
                if st.results is not None:
                    st.results[self._keys[i]] = value
                self._complete(st, i)
            elif self._settle_async(st, ctx, i, done, value):
                return True
        return False

    # Analysis ---------------------------------------------------------------------------

    def critical_path(self, spans: Sequence[Span]) -> list[Span]:
        """The chain of node spans that decided when the run ended, first to last.

        Starts from the node that ended last and repeatedly steps to the dependency that ended
        last (the one that made it ready), looking through group boundaries (a group's entry
        ends when it starts, its exit when it ends).
        """
        n_user = self._n_user

        def end(i: int) -> float:
            if i < n_user:
                return spans[i].end
            span = spans[n_user + self._gof[i]]
            return span.start if self._kind[i] == _ENTER else span.end

        def ran(i: int) -> bool:
            return spans[i if i < n_user else n_user + self._gof[i]].outcome != "pending"

        done = [i for i in range(n_user) if ran(i)]
        if not done:
            return []
        current = max(done, key=lambda i: (spans[i].end, -i))
        path = [spans[current]]
        while True:
            deps = [j for j in self._deps[current] if ran(j)]
            if not deps:
                break
            current = max(deps, key=lambda j: (end(j), -j))
            if current < n_user:
                path.append(spans[current])
        path.reverse()
        return path


_INF = float("inf")
_NOTHING: Any = object()


def _trio() -> Any:
    trio = sys.modules.get("trio")
    if trio is None:
        raise RuntimeError("the executor runs on asyncio or trio")
    return trio


async def _wait(st: _Exec) -> None:
    """Wait until a running node finished (asyncio: a future; trio: an event)."""
    if st.loop is not None:
        st.waiter = st.loop.create_future()
        await st.waiter
    else:
        st.waiter = _trio().Event()
        await st.waiter.wait()
    st.waiter = None


def _run_in_scopes(
    scopes: list[tuple[int, CancelScope]], action: Callable[[Any], Any], ctx: Any
) -> Any:
    if not scopes:
        return action(ctx)
    with scopes[0][1]:
        return _run_in_scopes(scopes[1:], action, ctx)
    return _NOTHING  # the scope swallowed its own deadline


async def _arun_in_scopes(
    scopes: list[tuple[int, CancelScope]], action: Callable[[Any], Any], ctx: Any
) -> Any:
    if not scopes:
        return await action(ctx)
    with scopes[0][1]:
        return await _arun_in_scopes(scopes[1:], action, ctx)
    return _NOTHING  # the scope swallowed its own deadline


def _mark(exc: BaseException, key: Hashable) -> None:
    try:
        if not hasattr(exc, "__timebound_node__"):
            exc.__timebound_node__ = key  # type: ignore[attr-defined]
    except Exception:  # an exception type with __slots__: nothing to attach, nothing lost
        pass
