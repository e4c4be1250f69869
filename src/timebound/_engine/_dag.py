"""A generic DAG executor for asyncio: nodes, dependencies, a priority-ordered ready queue, a
concurrency limit and per-node spans.

Shared machinery below the engines (ARCHITECTURE "One DAG executor"): the Constellation runtime
uses it today; the pipeline engine can reuse it. It knows nothing about deadlines itself: the
tasks it creates copy the caller's context, so they inherit every enclosing timebound scope.

Semantics:

* A node becomes ready when all its dependencies completed. Sync nodes (``is_async=False``) run
  inline the moment they are ready and never take a concurrency slot (they cannot wait).
* Ready async nodes start in priority order (higher first, then declaration order) while fewer
  than ``concurrency`` async nodes run. Priority only orders; it never preempts or cancels.
* The first node that raises fails the run: every running node is cancelled and awaited (nothing
  is left running), then that node's own exception is raised unchanged (``NodeFailed`` is never
  used to hide it; the failing node is available as ``exc.__timebound_node__``).
* When exactly one async node is ready and nothing runs, it is awaited in place instead of in a
  new task: a chain of dependent calls pays no task creation per step.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._core import _clock

__all__ = ["DagPlan", "Node", "Span"]

_C = TypeVar("_C")


@dataclass(frozen=True, slots=True)
class Node(Generic[_C]):
    """One unit of work. ``action(ctx)`` returns an awaitable when ``is_async``, else the value
    itself; with ``execute(..., results=d)`` each node's value is stored as ``d[key]``."""

    key: Hashable
    action: Callable[[_C], Any]
    deps: tuple[Hashable, ...] = ()
    priority: int = 50
    is_async: bool = True


@dataclass(slots=True)
class Span:
    """When a node became ready, started and ended (monotonic seconds, from ``_clock``)."""

    key: Hashable
    ready: float
    start: float = 0.0
    end: float = 0.0
    outcome: str = "pending"  # ok | error | cancelled | pending (never started)


class _Exec:
    """The state of one execution (a plain class: built once per run, on the hot path)."""

    __slots__ = (
        "finished",
        "ready",
        "remaining",
        "results",
        "running",
        "spans",
        "sync_ready",
        "waiter",
    )

    def __init__(
        self, remaining: list[int], sync_ready: list[int], ready: list[tuple[int, int]]
    ) -> None:
        self.remaining = remaining
        self.sync_ready = sync_ready
        self.ready = ready  # heap of (-priority, index)
        self.running: dict[asyncio.Task[Any], int] = {}
        self.finished: list[asyncio.Task[Any]] = []
        self.waiter: asyncio.Future[None] | None = None
        self.spans: list[Span] | None = None
        self.results: dict[Any, Any] | None = None


class DagPlan(Generic[_C]):
    """A validated graph of nodes, built once and executed any number of times."""

    def __init__(self, nodes: Sequence[Node[_C]]) -> None:
        self.nodes: tuple[Node[_C], ...] = tuple(nodes)
        index: dict[Hashable, int] = {}
        for i, n in enumerate(self.nodes):
            if n.key in index:
                raise ValueError(f"duplicate node key {n.key!r}")
            index[n.key] = i
        self._dependents: list[list[int]] = [[] for _ in self.nodes]
        self._indegree: list[int] = [0] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            for d in dict.fromkeys(n.deps):  # a dependency listed twice counts once
                j = index.get(d)
                if j is None:
                    raise ValueError(f"node {n.key!r} depends on unknown node {d!r}")
                self._dependents[j].append(i)
                self._indegree[i] += 1
        self._roots = [i for i, d in enumerate(self._indegree) if d == 0]
        # Ready-queue entries, built once: higher priority first, then declaration order.
        self._entries = [(-n.priority, i) for i, n in enumerate(self.nodes)]
        self._keys = [n.key for n in self.nodes]
        self._async_roots = sorted(self._entries[i] for i in self._roots if self.nodes[i].is_async)
        # popped from the end: reverse declaration order keeps sync roots in declaration order
        self._sync_roots = [i for i in reversed(self._roots) if not self.nodes[i].is_async]
        self._check_acyclic()

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
        if seen != len(self.nodes):
            cyclic = [self.nodes[i].key for i, d in enumerate(indeg) if d > 0]
            raise ValueError(f"dependency cycle among nodes {cyclic!r}")

    async def execute(
        self,
        ctx: _C,
        *,
        concurrency: int | None = None,
        record: bool = False,
        results: dict[Any, Any] | None = None,
    ) -> list[Span] | None:
        """Run every node once; returns the spans (in node order) when ``record`` is true.

        With ``results``, each node's value is stored there under its key as it completes.
        """
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        nodes = self.nodes
        st = _Exec(self._indegree.copy(), self._sync_roots.copy(), self._async_roots.copy())
        st.results = results
        if record:
            now = _clock.now()
            st.spans = [Span(n.key, now) for n in nodes]
        try:
            await self._loop(st, ctx, concurrency)
        except BaseException:
            await _cancel_all(st)
            raise
        return st.spans

    def _make_ready(self, st: _Exec, i: int) -> None:
        node = self.nodes[i]
        if node.is_async:
            heapq.heappush(st.ready, self._entries[i])
        else:
            st.sync_ready.append(i)

    def _complete(self, st: _Exec, i: int) -> None:
        remaining = st.remaining
        spans = st.spans
        now = _clock.now() if spans is not None else 0.0
        for j in self._dependents[i]:
            remaining[j] -= 1
            if remaining[j] == 0:
                if spans is not None:
                    spans[j].ready = now
                self._make_ready(st, j)

    async def _loop(self, st: _Exec, ctx: _C, concurrency: int | None) -> None:
        # The per-node path is written out with locals (no helper calls): it is what every
        # Constellation call pays (bench/dsl.py).
        nodes = self.nodes
        dependents = self._dependents
        entries = self._entries
        remaining = st.remaining
        ready = st.ready
        sync_ready = st.sync_ready
        running = st.running
        spans = st.spans
        results = st.results
        keys = self._keys
        heappush = heapq.heappush
        heappop = heapq.heappop
        loop = asyncio.get_running_loop()
        while True:
            while sync_ready:
                i = sync_ready.pop()
                if spans is not None:
                    spans[i].start = _clock.now()
                try:
                    value = nodes[i].action(ctx)
                except BaseException as exc:
                    _mark(exc, nodes[i].key)
                    if spans is not None:
                        spans[i].end = _clock.now()
                        spans[i].outcome = "error"
                    raise
                if results is not None:
                    results[keys[i]] = value
                if spans is not None:
                    spans[i].end = spans[i].start
                    spans[i].outcome = "ok"
                self._complete(st, i)
            while ready and (concurrency is None or len(running) < concurrency):
                i = heappop(ready)[1]
                node = nodes[i]
                if spans is not None:
                    spans[i].start = _clock.now()
                if not running and not ready:
                    # The only thing to do: await it here, no task needed.
                    try:
                        value = await node.action(ctx)
                    except BaseException as exc:
                        _mark(exc, node.key)
                        if spans is not None:
                            spans[i].end = _clock.now()
                            spans[i].outcome = (
                                "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
                            )
                        raise
                    if results is not None:
                        results[keys[i]] = value
                    if spans is not None:
                        spans[i].end = _clock.now()
                        spans[i].outcome = "ok"
                        self._complete(st, i)
                    else:  # _complete() written out: the untraced per-call path
                        for j in dependents[i]:
                            remaining[j] -= 1
                            if remaining[j] == 0:
                                if nodes[j].is_async:
                                    heappush(ready, entries[j])
                                else:
                                    sync_ready.append(j)
                    break  # sync nodes may have become ready: handle them first
                task = loop.create_task(node.action(ctx))
                running[task] = i
                task.add_done_callback(functools.partial(_on_done, st))
            else:
                if not running:
                    if not sync_ready and not ready:
                        return
                    continue
                if not st.finished:
                    st.waiter = loop.create_future()
                    await st.waiter
                    st.waiter = None
                self._drain(st)

    def _drain(self, st: _Exec) -> None:
        spans = st.spans
        finished = st.finished
        while finished:
            task = finished.pop(0)
            i = st.running.pop(task)
            if spans is not None:
                spans[i].end = _clock.now()
            if task.cancelled():
                # A node is cancelled only by someone else than us: treat it as a failure.
                if spans is not None:
                    spans[i].outcome = "cancelled"
                raise asyncio.CancelledError()
            exc = task.exception()
            if exc is not None:
                _mark(exc, self.nodes[i].key)
                if spans is not None:
                    spans[i].outcome = "error"
                raise exc
            if st.results is not None:
                st.results[self._keys[i]] = task.result()
            if spans is not None:
                spans[i].outcome = "ok"
            self._complete(st, i)


def _on_done(st: _Exec, task: asyncio.Task[Any]) -> None:
    st.finished.append(task)
    w = st.waiter
    if w is not None and not w.done():
        w.set_result(None)


def _mark(exc: BaseException, key: Hashable) -> None:
    try:
        if not hasattr(exc, "__timebound_node__"):
            exc.__timebound_node__ = key  # type: ignore[attr-defined]
    except Exception:  # an exception type with __slots__: nothing to attach, nothing lost
        pass


async def _cancel_all(st: _Exec) -> None:
    """Cancel every running node and wait for all of them, so nothing outlives the run."""
    tasks = list(st.running)
    for t in tasks:
        t.cancel()
    if tasks:
        results = await asyncio.gather(*tasks, return_exceptions=True)
        del results
    for t in tasks:
        if not t.cancelled():
            t.exception()  # mark retrieved: the run already reports the first failure
    st.running.clear()
