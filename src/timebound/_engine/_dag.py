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

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from ._run import _ENTER, _EXIT, _USER, Event, Span, _Execution

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
    ``reserve`` (seconds, D1.18) is kept for the fallback: the members see the group's
    effective deadline less it, and reaching that instant (or entering with no more than the
    reserve left) is the group's timeout, with the reserve still left for ``on_timeout``.
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
    reserve: float = 0.0


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
        run = _Execution(self, record, results, errors, sink)
        await run.run(ctx, concurrency)
        return run.spans if record is not False else None

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
