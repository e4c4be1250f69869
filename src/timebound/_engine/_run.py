"""Running a :class:`~timebound._engine._dag.DagPlan`: one :class:`_Execution` per run.

The plan (``_dag.py``) holds what never changes between runs: the internal index space (user
nodes, then an enter and an exit node per group), the edges, policies and ready-queue entries.
A run holds what one execution changes (counters, ready queues, group deadlines, results,
spans) and drives the nodes; the semantics it implements are described in ``_dag.py``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from .._core import _clock
from .._core._breakdown import Breakdown, build
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from .._core._scopes import CancelScope, current_deadline, fail_after, move_on_at

if TYPE_CHECKING:
    from ._dag import DagPlan, Group

_C = TypeVar("_C")

# Internal node kinds: user nodes first, then for each group an "enter" and an "exit" node.
_USER, _ENTER, _EXIT = 0, 1, 2

_INF = float("inf")
_NOTHING: Any = object()


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


class _NeedTaskGroup(Exception):
    """Internal: the run needs a second task; re-enter the loop inside a task group."""


class _Execution(Generic[_C]):
    """One execution of a plan: its state and the loop that drives it (a plain class with
    slots: built once per run, on the hot path)."""

    __slots__ = (
        "cancelled",
        "errors",
        "failure",
        "finished",
        "g_cut",
        "g_deadline",
        "g_timed_out",
        "g_timeout",
        "loop",
        "native",
        "plan",
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
        self,
        plan: DagPlan[_C],
        record: bool | list[Span],
        results: dict[Any, Any] | None,
        errors: dict[Any, BaseException] | None,
        sink: Callable[[Event], None] | None,
    ) -> None:
        self.plan = plan
        self.remaining = plan._indegree.copy()
        self.sync_ready = plan._sync_roots.copy()
        self.ready = plan._async_roots.copy()  # heap of (-priority, index)
        self.running = 0
        self.finished: list[tuple[int, bool, Any]] = []
        self.waiter: Any = None  # asyncio: a Future; trio: a trio.Event
        self.spans: list[Span] | None = None
        self.results = results
        self.errors: dict[Any, BaseException] | None = None
        self.sink = sink
        self.failure: BaseException | None = None
        self.tg: Any = None  # trio: the nursery holding the running nodes
        self.cancelled: type[BaseException] = asyncio.CancelledError
        # asyncio only: the running nodes' tasks
        self.native: dict[int, asyncio.Task[Any]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poisoned: set[int] | None = None
        self.g_deadline: list[float] = []
        self.g_cut: list[float] = []  # what the members see: the deadline, or less a reserve
        self.g_timeout: list[float | None] = []
        self.g_timed_out: list[bool] = []
        if not plan._plain:
            self.errors = errors if errors is not None else {}
            self.poisoned = set()
            ng = len(plan.groups)
            self.g_deadline = [_INF] * ng
            self.g_cut = [_INF] * ng
            self.g_timeout = [None] * ng
            self.g_timed_out = [False] * ng
        if record is not False or sink is not None:
            now = _clock.now()
            spans = [Span(n.key, now, group=n.group) for n in plan.nodes]
            spans += [Span(g.key, now, group=g.parent, is_group=True) for g in plan.groups]
            self.spans = spans
            if isinstance(record, list):
                record.extend(spans)
            if sink is not None:
                for i in plan._roots:
                    self._emit("ready", i, now)
        loop = asyncio._get_running_loop()
        if loop is not None:
            self.native = {}
            self.loop = loop
        else:
            self.cancelled = _trio().Cancelled

    async def run(self, ctx: _C, concurrency: int | None) -> None:
        """Run every node once; raise what made the run fail."""
        try:
            await self._loop(ctx, concurrency)
        except _NeedTaskGroup:  # trio: a nursery holds the running nodes
            async with _trio().open_nursery() as nursery:
                self.tg = nursery
                try:
                    await self._loop(ctx, concurrency)
                finally:
                    if self.failure is not None or self.running:
                        nursery.cancel_scope.cancel()
        except BaseException:
            if self.native:
                await self._teardown()
            raise
        if self.failure is not None and self.native:
            await self._teardown()
        if self.failure is not None:
            raise self.failure

    def _span(self, i: int) -> Span:
        plan = self.plan
        assert self.spans is not None
        if i < plan._n_user:
            return self.spans[i]
        return self.spans[plan._n_user + plan._gof[i]]

    def _emit(self, kind: str, i: int, at: float, outcome: str | None = None) -> None:
        plan = self.plan
        sink = self.sink
        if sink is None or plan._kind[i] == (_EXIT if kind != "end" else _ENTER):
            # A group's ready/start come from its enter node, its end from its exit node.
            return
        span = self._span(i)
        sink(Event(kind, span.key, at, outcome, span.group, span.is_group))

    def _start(self, i: int) -> None:
        plan = self.plan
        spans = self.spans
        if spans is not None:
            now = _clock.now()
            if i < plan._n_user:
                spans[i].start = now
            elif plan._kind[i] == _ENTER:
                spans[plan._n_user + plan._gof[i]].start = now
            if self.sink is not None:
                self._emit("start", i, now)

    def _end(self, i: int, outcome: str, ran: bool = True) -> None:
        """Settle node ``i``'s span; ``ran=False`` for one settled without running (skipped, or
        its region already out of time): it starts where it ends, not at the clock's zero."""
        plan = self.plan
        spans = self.spans
        if spans is not None:
            now = _clock.now()
            if i < plan._n_user:
                span = spans[i]
            elif plan._kind[i] == _EXIT:
                span = spans[plan._n_user + plan._gof[i]]
            else:
                span = None
            if span is not None:
                if not ran and (i < plan._n_user or span.start < span.ready):
                    span.start = now  # a user node never started; a group never entered
                span.end = now
                span.outcome = outcome
            if self.sink is not None:
                self._emit("end", i, now, outcome)

    def _complete(self, i: int, poison: bool = False) -> None:
        plan = self.plan
        remaining = self.remaining
        spans = self.spans
        now = _clock.now() if spans is not None else 0.0
        if poison:
            assert self.poisoned is not None
            self.poisoned.update(plan._dependents[i])
        for j in plan._dependents[i]:
            remaining[j] -= 1
            if remaining[j] == 0:
                if spans is not None:
                    if plan._kind[j] != _EXIT:
                        self._span(j).ready = now
                    self._emit("ready", j, now)
                if plan._async[j]:
                    heapq.heappush(self.ready, plan._entries[j])
                else:
                    self.sync_ready.append(j)

    def _blocked(self, i: int) -> str | None:
        """Why node ``i`` must not run (skipped, or its region's deadline passed), else None."""
        plan = self.plan
        if self.poisoned is None:
            return None
        if i in self.poisoned and plan._kind[i] == _USER:
            return "skipped"
        chain = plan._chain[i]
        if chain:
            now = _clock.now()
            for g in chain:
                if self.g_timed_out[g]:
                    return "skipped"
                if now >= self.g_cut[g]:  # never early: reached only at clock() >= deadline
                    self.g_timed_out[g] = True
                    return "timed_out"
        return None

    def _fail(self, i: int, exc: BaseException) -> bool:
        """Record node ``i``'s failure; true when the run must stop."""
        plan = self.plan
        _mark(exc, plan._keys[i])
        cancel = isinstance(exc, self.cancelled)
        if i < plan._n_user and plan._policy[i] == "collect" and not cancel:
            assert self.errors is not None
            self.errors[plan._keys[i]] = exc
            self._end(i, "error")
            self._complete(i, poison=True)
            return False
        self._end(i, "cancelled" if cancel else "error")
        self.failure = exc
        return True

    def _run_sync(self, ctx: _C, i: int) -> bool:
        """Run a sync (or bookkeeping) node inline; true when the run must stop."""
        plan = self.plan
        kind = plan._kind[i]
        if kind != _USER:
            if self._blocked(i) is not None:
                # An enclosing region ran out: this group is never entered (its members are
                # skipped through the poison) or settles as skipped -- no hooks, no fallback.
                if kind == _EXIT:
                    self._end(i, "skipped", ran=False)
                self._complete(i, poison=kind == _ENTER)
                return False
            if kind == _ENTER:
                return self._enter_group(ctx, i)
            return self._exit_group(ctx, i, None)
        why = self._blocked(i) if self.poisoned or plan._chain[i] else None
        if why is not None:
            self._end(i, why, ran=False)
            self._complete(i, poison=why == "skipped" and i in (self.poisoned or ()))
            return False
        self._start(i)
        chain = plan._chain[i]
        try:
            if chain:
                scopes = self._scopes(chain)
                try:
                    value = _run_in_scopes(scopes, plan.nodes[i].action, ctx)
                except DeadlineExceeded as err:
                    if not self._refused(scopes, err):
                        raise
                    self._end(i, "timed_out")
                    self._complete(i)
                    return False
                if self._expired(scopes):
                    self._end(i, "late")
                    self._complete(i)
                    return False
            else:
                value = plan.nodes[i].action(ctx)
        except BaseException as exc:
            return self._fail(i, exc)
        if self.results is not None:
            self.results[plan._keys[i]] = value
        self._end(i, "ok")
        self._complete(i)
        return False

    def _enter_group(self, ctx: _C, i: int) -> bool:
        plan = self.plan
        g = plan._gof[i]
        group = plan.groups[g]
        self._start(i)
        if self.poisoned is not None and i in self.poisoned:
            # Never entered: the poison reaches every member, then the exit and its dependents.
            self._complete(i, poison=True)
            return False
        timeout = group.timeout
        try:
            if group.on_enter is not None:
                group.on_enter(ctx)
            seconds = timeout(ctx) if callable(timeout) else timeout
        except BaseException as exc:
            return self._fail(i, exc)
        if seconds is not None:
            self.g_timeout[g] = seconds
            now = _clock.now()
            self.g_deadline[g] = self.g_cut[g] = now + max(0.0, seconds)
            if group.reserve:
                self.g_cut[g] = cut = self._visible(g, plan._chain[i]) - group.reserve
                if cut <= now:
                    # D1.20: no more than the reserve left refuses the members; the group's
                    # on_timeout runs at once, with what is left (they are skipped).
                    self.g_timed_out[g] = True
        self._complete(i)
        return False

    def _visible(self, g: int, chain: tuple[int, ...]) -> float:
        """The effective deadline of group ``g``'s members before its reserve: its own, the
        run's and what its enclosing groups show their members (D1.5, D1.18)."""
        eff = min(self.g_deadline[g], current_deadline().when)
        for h in chain:
            eff = min(eff, self.g_cut[h])
        return eff

    async def _fallback(self, group: Group[_C], ctx: _C) -> Any:
        on_timeout = group.on_timeout
        assert callable(on_timeout)
        began = _clock.now()
        try:
            value = on_timeout(ctx)
            if inspect.isawaitable(value):
                value = await value
        except DeadlineExceeded as err:
            # D13: a fallback that reports the region's timeout (a pipeline's fail_plan) says
            # where the region's budget went.
            if err.breakdown is None:
                # With a reserve: either it fired (the fallback reports it at once) or the
                # fallback ran in it until the group's own deadline.
                fired = err.set_by == f"reserve of {group.source} {group.key}"
                err.breakdown = self._region_breakdown(group, None if fired else began)
            raise
        return value

    def _region_breakdown(self, group: Group[_C], fallback_at: float | None = None) -> Breakdown:
        """D13: a timed-out region's time from its entry to now, its members as parts (they
        may run side by side: such parts overlap). A group with a reserve: the fallback that ran
        in the reserve (from ``fallback_at``) is a part of its own; a bound reported when the
        reserve was reached is named ``reserve of …``, its budget the time before the reserve."""
        g = self.plan.groups.index(group)
        timeout = self.g_timeout[g]
        now = _clock.now()
        t0 = self.g_deadline[g] - (timeout or 0.0) if timeout is not None else now
        marks: list[Any] = []
        name = f"region {str(group.key)[:100]}"
        if group.reserve:
            if fallback_at is not None:
                marks.append(
                    (
                        "fallback",
                        f"reserve of {name}",
                        fallback_at,
                        now,
                        group.reserve,
                        "timeout",
                        None,
                    )
                )
            else:  # refused at entry (D1.20), the time before the reserve is nothing
                name, timeout = f"reserve of {name}", max(0.0, self.g_cut[g] - t0)
        for span in self.spans or ():
            if span.group != group.key or span.start <= 0.0 or span.start < t0:
                continue
            end = span.end if span.end > span.start else now
            kind = "region" if span.is_group else "node"
            outcome = span.outcome if span.outcome != "pending" else "cut"
            marks.append((kind, str(span.key)[:120], span.start, end, None, outcome, None))
        return build("bound", name, t0, now, timeout, "timeout", marks, len(marks))

    def _exit_group(self, ctx: _C, i: int, fallback: tuple[bool, Any] | None) -> bool:
        """Settle group ``i``; ``fallback`` is (True, its value) when one ran, or (False,
        outcome) when an enclosing region's deadline cut it."""
        plan = self.plan
        g = plan._gof[i]
        group = plan.groups[g]
        poisoned = self.poisoned is not None and i in self.poisoned
        if not self.g_timed_out[g]:
            if not poisoned and group.on_success is not None:
                try:
                    group.on_success(ctx)
                except BaseException as exc:
                    return self._fail(i, exc)
            self._end(i, "skipped" if poisoned else "ok")
            self._complete(i, poison=poisoned)
            return False
        if fallback is not None:
            ok, value = fallback
            if not ok:
                # The enclosing region timed out too; its own exit decides what happens.
                self._end(i, value)
                self._complete(i)
                return False
            if self.results is not None:
                self.results[group.key] = value
            self._end(i, "timed_out")
            self._complete(i)
            return False
        error = DeadlineExceeded(
            source=group.source,
            timeout=self.g_timeout[g],
            deadline=Deadline(self.g_deadline[g]),
            what=f"group {group.key!r}",
            set_by=f"{group.source} {group.key}",
        )
        _mark(error, group.key)
        error.breakdown = self._region_breakdown(group)  # D13
        self._end(i, "timed_out")
        if group.on_timeout == "collect":
            assert self.errors is not None
            self.errors[group.key] = error
            self._complete(i, poison=True)
            return False
        self.failure = error
        return True

    def _scopes(self, chain: tuple[int, ...]) -> list[tuple[int, CancelScope]]:
        plan = self.plan
        scopes: list[tuple[int, CancelScope]] = []
        for g in chain:
            if self.g_deadline[g] == _INF:
                continue
            group = plan.groups[g]
            at = Deadline(self.g_deadline[g])
            if not group.reserve:
                scopes.append((g, move_on_at(at, source=group.source)))
                continue
            # D1.18: the group's scope ends at its deadline and shows its members that less
            # the reserve; the scope under it (no deadline of its own) stops them there, and
            # the reserve's error makes the group's scope expired (D1.19).
            what = f"{group.source} {group.key}"
            scopes.append(
                (g, move_on_at(at, source=group.source, what=what, reserve=group.reserve))
            )
            scopes.append((g, fail_after(None)))
        return scopes

    def _refused(self, scopes: list[tuple[int, CancelScope]], err: DeadlineExceeded) -> bool:
        """Whether ``err`` is a group's reserve refusing a member that started at or after the
        reserved instant (D1.20; the check before it ran came a moment earlier): that is the
        group's timeout, as if the member had been stopped there."""
        plan = self.plan
        for g, _ in scopes:
            group = plan.groups[g]
            if group.reserve and err.set_by == f"reserve of {group.source} {group.key}":
                self.g_timed_out[g] = True
                return True
        return False

    def _expired(self, scopes: list[tuple[int, CancelScope]]) -> bool:
        # The scope itself reports whether ITS deadline fired (D2.2); the outermost one that
        # did is the region that timed out.
        for g, scope in scopes:
            if scope.expired:
                self.g_timed_out[g] = True
                return True
        return False

    async def _run_async(self, ctx: _C, i: int) -> tuple[bool, Any]:
        """Run async node ``i``: (True, value) or (False, outcome) when it produced nothing."""
        plan = self.plan
        chain = plan._chain[i]
        if plan._kind[i] == _EXIT:
            # A fallback runs outside its own expired region, inside the enclosing ones.
            group = plan.groups[plan._gof[i]]
            action: Callable[[_C], Any] = functools.partial(self._fallback, group)
        else:
            action = plan.nodes[i].action
        if not chain:
            return True, await action(ctx)
        scopes = self._scopes(chain)
        try:
            value = await _arun_in_scopes(scopes, action, ctx)
        except DeadlineExceeded as err:
            if not self._refused(scopes, err):
                raise
            return False, "timed_out"
        if self._expired(scopes):
            return False, "late" if value is not _NOTHING else "timed_out"
        return True, value

    def _settle_async(self, ctx: _C, i: int, ok: bool, value: Any) -> bool:
        """Book the outcome of async node ``i``; true when the run must stop."""
        plan = self.plan
        if plan._kind[i] == _EXIT:
            return self._exit_group(ctx, i, (ok, value))
        if not ok:
            self._end(i, value)
            self._complete(i)
            return False
        if self.results is not None:
            self.results[plan._keys[i]] = value
        self._end(i, "ok")
        self._complete(i)
        return False

    async def _loop(self, ctx: _C, concurrency: int | None) -> None:
        plan = self.plan
        # The per-node path for plans without groups or collect policies is written out with
        # locals: it is what every Constellation call pays (bench/dsl.py).
        nodes = plan.nodes
        dependents = plan._dependents
        entries = plan._entries
        is_async = plan._async
        remaining = self.remaining
        ready = self.ready
        sync_ready = self.sync_ready
        results = self.results
        keys = plan._keys
        plain = plan._plain and self.spans is None
        heappush = heapq.heappush
        heappop = heapq.heappop
        cancelled = self.cancelled
        aloop = self.loop
        native: dict[int, asyncio.Task[Any]] = self.native if self.native is not None else {}
        while True:
            while sync_ready:
                i = sync_ready.pop()
                if plain:
                    try:
                        value = nodes[i].action(ctx)
                    except BaseException as exc:
                        _mark(exc, keys[i])
                        self.failure = exc
                        return
                    if results is not None:
                        results[keys[i]] = value
                    self._complete(i)
                elif self._run_sync(ctx, i):
                    return
            while ready and (concurrency is None or self.running < concurrency):
                entry = heappop(ready)
                i = entry[1]
                if not plain:
                    why = self._blocked(i)
                    if why is not None:
                        self._end(i, why, ran=False)
                        poison = why == "skipped" and i in (self.poisoned or ())
                        self._complete(i, poison=poison and plan._kind[i] != _EXIT)
                        continue
                    if plan._kind[i] == _EXIT and not self.g_timed_out[plan._gof[i]]:
                        # in time (or never entered): the fallback is not needed
                        if self._exit_group(ctx, i, None):
                            return
                        continue
                if self.running or ready:
                    if aloop is not None:
                        self._start(i)
                        self.running += 1
                        native[i] = aloop.create_task(self._spawned(ctx, i))
                        continue
                    if self.tg is None:
                        heappush(ready, entry)
                        raise _NeedTaskGroup
                    self._start(i)
                    self.running += 1
                    self.tg.start_soon(self._spawned, ctx, i)
                    continue
                # The only thing to do: await it here, no task needed.
                if plain:
                    try:
                        value = await nodes[i].action(ctx)
                    except cancelled:
                        raise
                    except BaseException as exc:
                        _mark(exc, keys[i])
                        self.failure = exc
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
                    self._start(i)
                    try:
                        ok, value = await self._run_async(ctx, i)
                    except cancelled:
                        self._end(i, "cancelled")
                        raise
                    except BaseException as exc:
                        if self._fail(i, exc):
                            return
                        break
                    if self._settle_async(ctx, i, ok, value):
                        return
                break  # sync nodes may have become ready: handle them first
            else:
                if not self.running:
                    if not sync_ready and not ready:
                        return
                    continue
                if not self.finished:
                    await self._wait()
                if self._drain(ctx):
                    return

    async def _teardown(self) -> None:
        """asyncio: cancel every running node once and wait for all of them, so nothing outlives
        the run (a node may await its cleanup, as asyncio code expects). On trio the task
        group's own cancel scope does this."""
        native = self.native
        assert native is not None
        for task in list(native.values()):
            task.cancel()
        while self.running:
            if not self.finished:
                await self._wait()
            self.running -= len(self.finished)
            for i, _, _ in self.finished:
                self._end(i, "cancelled")
            self.finished.clear()

    async def _spawned(self, ctx: _C, i: int) -> None:
        try:
            ok, value = await self._run_async(ctx, i)
        except BaseException as exc:
            tg = self.tg
            if tg is not None and tg.cancel_scope.cancel_called and isinstance(exc, self.cancelled):
                self._end(i, "cancelled")
                raise  # trio: the run is being torn down by its nursery
            # Cancelled by someone other than the run, or a failure: the run decides.
            self._finish(i, False, exc)
            return
        self._finish(i, True, (ok, value))

    def _finish(self, i: int, ok: bool, payload: Any) -> None:
        if self.native is not None:
            self.native.pop(i, None)
        self.finished.append((i, ok, payload))
        w = self.waiter
        if w is not None:
            if self.loop is None:
                w.set()
            elif not w.done():
                w.set_result(None)

    def _drain(self, ctx: _C) -> bool:
        plan = self.plan
        finished = self.finished
        while finished:
            i, ok, payload = finished.pop(0)
            self.running -= 1
            if not ok:
                if plan._plain and self.spans is None:
                    _mark(payload, plan._keys[i])
                    self.failure = payload
                    return True
                if self._fail(i, payload):
                    return True
                continue
            done, value = payload
            if plan._plain and self.spans is None:
                if self.results is not None:
                    self.results[plan._keys[i]] = value
                self._complete(i)
            elif self._settle_async(ctx, i, done, value):
                return True
        return False

    async def _wait(self) -> None:
        """Wait until a running node finished (asyncio: a future; trio: an event)."""
        if self.loop is not None:
            self.waiter = self.loop.create_future()
            await self.waiter
        else:
            self.waiter = _trio().Event()
            await self.waiter.wait()
        self.waiter = None


def _trio() -> Any:
    trio = sys.modules.get("trio")
    if trio is None:
        raise RuntimeError("the executor runs on asyncio or trio")
    return trio


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
