"""The pipeline engine: runs a validated artifact on the shared DAG executor.

The plan's chain becomes executor nodes whose dependencies follow the data (a node waits for
the nodes that write what it reads or writes, and for every rowset-changing op); a wrapper
branch runs its steps in order; each ``timeout_wrapper`` becomes an executor group that owns the
region deadline, its transaction and its fallback (``_region.py``, D5).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import pyarrow as pa

from .._core import _clock
from .._core._deadline import Deadline
from .._core._errors import ConfigurationError
from .._core._renamed import renamed
from .._core._scopes import checkpoint, current_deadline, fail_after
from .._engine import DagPlan, Group, Node
from ..telemetry._tracing import run_span
from . import _expr
from ._artifact import Artifact
from ._bounded import await_abandonable, run_in_worker
from ._errors import TaskError, ValidationError
from ._model import REGISTRY_KEYWORD, Catalog, TaskSpec, deprecated_registry, evaluate
from ._region import RegionState, region_group
from ._rowset import RowSet
from ._trace import Trace
from ._validate import SUPPORTED_CAPABILITIES, Checked, check_params, task_known, validate

__all__ = ["Engine", "RunOutput", "TaskContext"]

_BARRIERS = ("filter", "sort", "take", "dedupe", "timeout_wrapper")


class TaskContext:
    """What a task sees: ``params`` (its arguments and the resolved params), ``deadline`` (its
    effective deadline: the minimum of its own budget, its region's and every enclosing one),
    ``nrows``, :meth:`remaining` and :meth:`check`."""

    __slots__ = ("deadline", "nrows", "params")

    def __init__(self, params: Mapping[str, Any], deadline: Deadline, nrows: int) -> None:
        self.params = params
        self.deadline = deadline
        self.nrows = nrows

    def remaining(self) -> float:
        """Seconds left before the task's deadline (``math.inf`` without one), as
        :meth:`Deadline.remaining <timebound.Deadline.remaining>` counts them."""
        return self.deadline.remaining()

    def time_remaining_ms(self) -> float:
        """Deprecated (D1.12): milliseconds left; use :meth:`remaining` (seconds)."""
        warnings.warn(
            "TaskContext.time_remaining_ms() is deprecated; use TaskContext.remaining() "
            "(seconds, as Deadline.remaining())",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.deadline.remaining() * 1000.0

    def check(self) -> None:
        """Raise :class:`~timebound.DeadlineExceeded` when the deadline has passed."""
        checkpoint()


@dataclass(frozen=True)
class RunOutput:
    """A finished run: ``rows`` (active rows, in order) and its ``trace``. (It was called
    ``Result``, a name :data:`timebound.policies.Result` also has.)"""

    rows: pa.Table
    trace: Trace


class _Run:
    """The state of one run (the executor's context object)."""

    __slots__ = ("base", "params", "rowset", "trace", "values", "wrappers")

    def __init__(self, rowset: RowSet, params: dict[str, tuple[Any, str]], trace: Trace) -> None:
        self.rowset = rowset
        self.params = params  # param id -> (value, origin)
        # what a task without arguments sees as ctx.params (read-only, shared by those tasks)
        self.values: Mapping[str, Any] = MappingProxyType({p: v for p, (v, _) in params.items()})
        self.trace = trace
        self.base = _clock.now()
        self.wrappers: dict[str, RegionState] = {}

    def ms(self, t: float) -> float:
        return (t - self.base) * 1000.0


@dataclass
class _Compiled:
    plan: DagPlan[_Run]
    checked: Checked
    meta: dict[str, dict[str, Any]]  # node id -> span metadata (op, name, parent, deps)
    # The same plan for runs under a deadline (D5.7), built when first needed.
    bounded: _Compiled | None = None


class Engine:
    """Runs artifacts against ``catalog``'s tasks. ``env`` is ``"prod"`` or ``"dev"`` (D5.6);
    ``capabilities`` restricts what the engine enables (default: everything it supports).

    Validated plans are cached on the engine, keyed by plan digest and capabilities digest;
    the ``plan_cache_size`` most recently used are kept.
    """

    @renamed(registry=REGISTRY_KEYWORD)
    def __init__(
        self,
        catalog: Catalog,
        *,
        env: Literal["prod", "dev"] = "prod",
        capabilities: Collection[str] | None = None,
        plan_cache_size: int = 128,
    ) -> None:
        if not isinstance(catalog, Catalog):
            raise ConfigurationError(f"catalog must be a pl.Catalog, got {catalog!r}")
        if env not in ("prod", "dev"):
            raise ConfigurationError(f"env must be 'prod' or 'dev', got {env!r}", option="env")
        if isinstance(capabilities, str):
            raise ConfigurationError(
                "capabilities is a collection of capability ids, e.g. [pl.CAPABILITY]",
                option="capabilities",
            )
        if isinstance(plan_cache_size, bool) or not isinstance(plan_cache_size, int):
            raise ConfigurationError("plan_cache_size must be an integer", option="plan_cache_size")
        if plan_cache_size < 1:
            raise ConfigurationError("plan_cache_size must be >= 1", option="plan_cache_size")
        self.catalog = catalog
        self.env = env
        self._cache_size = plan_cache_size
        self.capabilities = frozenset(
            SUPPORTED_CAPABILITIES if capabilities is None else capabilities
        )
        self.capabilities_digest = (
            "sha256:" + hashlib.sha256("\n".join(sorted(self.capabilities)).encode()).hexdigest()
        )
        self._cache: dict[tuple[str, str], _Compiled] = {}
        #: Tasks this engine's runs stopped waiting for while they still ran (D5.7, D5.8).
        self.abandoned = 0

    @property
    def registry(self) -> Catalog:
        """Deprecated: :attr:`catalog`."""
        return deprecated_registry(self.catalog, "Engine")

    def _abandoned(self, name: str) -> None:
        self.abandoned += 1

    # Preparing ------------------------------------------------------------------------------

    def prepare(self, artifact: Artifact) -> None:
        """Validate ``artifact`` against this engine (cached); raises ValidationError."""
        self._compiled(artifact)

    def _compiled(self, artifact: Artifact, bounded: bool = False) -> _Compiled:
        if not isinstance(artifact, Artifact):
            raise TypeError(f"run() takes a pl.Artifact, got {type(artifact).__name__}")
        key = (artifact.digest, self.capabilities_digest)
        compiled = self._cache.pop(key, None)
        if compiled is None:
            checked = validate(artifact, self.catalog, capabilities=self.capabilities)
            compiled = self._build(artifact, checked, False)
            if len(self._cache) >= self._cache_size:
                del self._cache[next(iter(self._cache))]  # the least recently used
        self._cache[key] = compiled  # (re)inserted last: most recently used
        if not bounded:
            return compiled
        if compiled.bounded is None:
            compiled.bounded = self._build(artifact, compiled.checked, True)
        return compiled.bounded

    def _build(self, artifact: Artifact, checked: Checked, bounded: bool) -> _Compiled:
        """The executor plan; ``bounded``: for a run under a deadline, where every sync task
        runs where the deadline can leave it behind (D5.7)."""
        builder = _Builder(self, artifact, bounded)
        builder.chain(artifact.plan["nodes"], "", None, None)
        return _Compiled(DagPlan(builder.nodes, builder.groups), checked, builder.meta)

    # Running --------------------------------------------------------------------------------

    async def run(
        self,
        artifact: Artifact,
        rows: pa.Table,
        *,
        request_params: Mapping[str, Any] | None = None,
        source_params: Mapping[str, Any] | None = None,
    ) -> RunOutput:
        """Run the plan on ``rows``; every enclosing timebound deadline bounds the run."""
        compiled = self._compiled(artifact, bounded=not current_deadline().is_never)
        rowset = self._rowset(rows, compiled.checked)
        params = self._params(artifact, request_params, source_params)
        trace = Trace(artifact.digest, round(_clock.wall() * 1_000_000_000), compiled.meta)
        run = _Run(rowset, params, trace)
        trace.base = run.base
        # With spans exported: a span for the run, its regions and tasks as children (D10.4).
        with run_span("pipeline.run", plan_digest=artifact.digest) as export:
            # The listeners hear each task and region as it starts and ends (D10.11).
            spans, sink = trace.recording()
            try:
                await compiled.plan.execute(run, record=spans, sink=sink)
            except Exception as exc:
                _locate(exc, compiled.meta)
                raise
            finally:
                export(trace)
        present = set(rowset.keys())
        keys = [k for k in self.catalog.keys if k in present]
        return RunOutput(rowset.table(keys), trace)

    def run_sync(
        self,
        artifact: Artifact,
        rows: pa.Table,
        *,
        request_params: Mapping[str, Any] | None = None,
        source_params: Mapping[str, Any] | None = None,
    ) -> RunOutput:
        """:meth:`run` from synchronous code (not from inside an event loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("run_sync() was called inside an event loop; await run() there")
        return asyncio.run(
            self.run(artifact, rows, request_params=request_params, source_params=source_params)
        )

    def _rowset(self, rows: pa.Table, checked: Checked) -> RowSet:
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
        columns: dict[str, pa.Array] = {}
        for name in rows.column_names:
            kdef = self.catalog.keys.get(name)
            if kdef is None:
                raise ValidationError("reference", f"input column {name!r} is not a registered key")
            if name in columns:
                raise ValidationError("reference", f"input column {name!r} appears twice")
            column = rows.column(name).combine_chunks()
            if column.type != kdef.type:
                raise ValidationError(
                    "type",
                    f"input column {name!r} is {column.type}, key {name!r} holds {kdef.type}",
                )
            if not kdef.nullable and column.null_count:
                raise ValidationError(
                    "type", f"input column {name!r} has nulls, key {name!r} is not nullable"
                )
            columns[name] = column
        for key, (node_id, in_branch) in checked.inputs.items():
            if key not in columns:
                raise ValidationError(
                    "closure" if in_branch else "reference",
                    f"reads key {key!r}, which the input rows do not have"
                    + (" (not available at the wrapper's input)" if in_branch else ""),
                    node_id=node_id,
                )
        return RowSet(columns, rows.num_rows)

    def _params(
        self,
        artifact: Artifact,
        request: Mapping[str, Any] | None,
        source: Mapping[str, Any] | None,
    ) -> dict[str, tuple[Any, str]]:
        """Each param's value and origin: plan, then request, then source, then default (a
        plan value is a link-time constant no request can change)."""
        layers: list[tuple[str, Mapping[str, Any]]] = [("plan", artifact.plan["params"])]
        for origin, given in (("request", request), ("source", source)):
            if given is None:
                continue
            if not isinstance(given, Mapping):
                raise ConfigurationError(f"{origin}_params must be a mapping")
            check_params(self.catalog, given, origin)
            layers.append((origin, given))
        out: dict[str, tuple[Any, str]] = {}
        for pid, pdef in self.catalog.params.items():
            for origin, values in layers:
                if pid in values:
                    out[pid] = (values[pid], origin)
                    break
            else:
                if pdef.has_default:
                    out[pid] = (pdef.default, "default")
        return out


def _locate(exc: Exception, meta: Mapping[str, Mapping[str, Any]]) -> None:
    """Map a run-time error back to the node and its authoring call (file and line)."""
    key = getattr(exc, "__timebound_node__", None)
    m = meta.get(key) if isinstance(key, str) else None
    if m is None:
        return
    span = m["source_span"]
    if isinstance(exc, TaskError | ValidationError) and exc.node_id is None:
        exc.node_id = key
        exc.source_span = span
    elif not isinstance(exc, ValidationError | TaskError):
        exc.add_note(f"in pipeline node {key} ({span['file']}:{span['line']})")


class _Builder:
    """Turns artifact nodes into executor nodes and groups."""

    def __init__(self, engine: Engine, artifact: Artifact, bounded: bool) -> None:
        self.engine = engine
        # Whether a deadline bounds every node built here (the run's, or an enclosing region's).
        self.bounded = bounded
        self.registry = engine.catalog
        self.artifact = artifact
        self.plan_params = artifact.plan["params"]
        self.nodes: list[Node[_Run]] = []
        self.groups: list[Group[_Run]] = []
        self.meta: dict[str, dict[str, Any]] = {}

    def chain(
        self, nodes: list[dict[str, Any]], prefix: str, group: str | None, parent: str | None
    ) -> list[str]:
        """Add a chain's nodes to ``group`` (the executor's region) with ``parent`` (the
        wrapper their spans nest under); returns their executor keys."""
        keys: list[str] = []
        effects: list[tuple[set[str], set[str] | None]] = []  # (reads, writes; None = barrier)
        for node in nodes:
            key = prefix + node["node_id"]
            reads, writes = self._effects(node)
            deps: list[str] = []
            if parent is not None:
                # A wrapper branch runs its steps in order, one after the other (RFC 0002
                # leaves parallelism inside a region an open question: we do not take it).
                deps = keys[-1:]
            else:
                for j in range(len(keys) - 1, -1, -1):
                    r, w = effects[j]
                    if w is None or writes is None or w & (reads | writes) or r & writes:
                        deps.append(keys[j])
                        if w is None:
                            break  # a barrier: everything before it is already behind it
                deps.reverse()
            self.meta[key] = {
                "op": node["op"],
                "name": node["params"].get("name", node["op"])
                if node["op"] == "task"
                else node["op"],
                "parent": parent,
                "deps": deps,
                "source_span": node["source_span"],
            }
            if node["op"] == "timeout_wrapper":
                self._wrapper(node, key, tuple(deps), group)
            else:
                action, is_async = self._action(node, key, self.bounded or group is not None)
                self.nodes.append(Node(key, action, tuple(deps), 50, is_async, group))
            keys.append(key)
            effects.append((reads, writes))
        return keys

    def _effects(self, node: dict[str, Any]) -> tuple[set[str], set[str] | None]:
        op, p = node["op"], node["params"]
        if op in _BARRIERS:
            return set(), None
        if op == "vm":
            return _expr.columns(p["expr"]), {p["key"]}
        if op == "fill_defaults":
            return set(), set(p["keys"])
        task = self.registry.tasks[p["name"]]
        if task.rowset != "preserve":
            return set(task.reads), None
        w = evaluate(task.writes, task_known(node, self.plan_params, self.registry))
        return set(task.reads), None if w.keys is None else set(w.keys)

    # Ops --------------------------------------------------------------------------------

    def _action(
        self, node: dict[str, Any], key: str, bounded: bool
    ) -> tuple[Callable[[_Run], Any], bool]:
        op, p = node["op"], node["params"]
        if op == "task":
            task = self.registry.tasks[p["name"]]
            return _task_action(
                self.registry, task, p["args"], key, bounded, self.engine._abandoned
            )
        if op == "vm":
            kdef = self.registry.keys[p["key"]]
            expr = p["expr"]

            def vm(run: _Run) -> None:
                rs = run.rowset
                value = _expr.evaluate(expr, rs.column, rs.active_count)
                try:
                    column = value.cast(kdef.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise TaskError(f"vm {kdef.id!r}: {exc}", task=key, key=kdef.id) from None
                if isinstance(column, pa.ChunkedArray):
                    column = column.combine_chunks()
                if not kdef.nullable and column.null_count:
                    raise TaskError(
                        f"vm {kdef.id!r} produced nulls for a non-nullable key",
                        task=key,
                        key=kdef.id,
                    )
                rs.write(kdef.id, column)

            return vm, False
        if op == "filter":
            expr = p["expr"]

            def filter_(run: _Run) -> None:
                rs = run.rowset
                rs.filter(_expr.evaluate(expr, rs.column, rs.active_count))

            return filter_, False
        if op == "sort":
            k, desc = p["key"], p["descending"]
            return (lambda run: run.rowset.sort(k, desc)), False
        if op == "take":
            n = p["n"]
            return (lambda run: run.rowset.take(n)), False
        if op == "dedupe":
            k = p["key"]
            return (lambda run: run.rowset.dedupe(k)), False
        assert op == "fill_defaults"
        kdefs = [self.registry.keys[k] for k in p["keys"]]

        def fill_defaults(run: _Run) -> None:
            rs = run.rowset
            n = rs.active_count
            for kdef in kdefs:
                if kdef.nullable:
                    rs.write(kdef.id, pa.nulls(n, type=kdef.type))
                else:
                    rs.write(kdef.id, pa.repeat(pa.scalar(kdef.default, type=kdef.type), n))

        return fill_defaults, False

    def _wrapper(
        self, node: dict[str, Any], key: str, deps: tuple[str, ...], parent: str | None
    ) -> None:
        p = node["params"]
        fragments = self.artifact.fragments
        success_nodes = fragments[p["success"]["fragment_digest"]]["nodes"]
        fail_nodes = fragments[p["fail"]["fragment_digest"]]["nodes"]
        # The fail branch is a plan of its own, run by the fallback: outside the expired
        # region, under every enclosing bound (D5.2).
        fail_builder = _Builder(self.engine, self.artifact, self.bounded or parent is not None)
        fail_builder.meta = self.meta
        fail_builder.chain(fail_nodes, f"{key}/fail/", None, key)
        fail_plan: DagPlan[_Run] = DagPlan(fail_builder.nodes, fail_builder.groups)
        w_success = sorted(self._exact_writes(success_nodes))
        self.groups.append(
            region_group(node, key, deps, parent, self.engine.env, w_success, fail_plan)
        )
        self.chain(success_nodes, f"{key}/success/", key, key)

    def _exact_writes(self, nodes: list[dict[str, Any]]) -> set[str]:
        out: set[str] = set()
        for node in nodes:
            _, writes = self._effects(node)
            if node["op"] == "timeout_wrapper":
                out |= self._exact_writes(
                    self.artifact.fragments[node["params"]["success"]["fragment_digest"]]["nodes"]
                )
            elif writes is not None:
                out |= writes
        return out


def _task_action(
    registry: Catalog,
    task: TaskSpec,
    args: Mapping[str, Any],
    key: str,
    bounded: bool,
    on_abandon: Callable[[str], None],
) -> tuple[Callable[[_Run], Any], bool]:
    fn = task.fn
    reads = task.reads
    timeout = task.timeout

    def context(run: _Run) -> tuple[pa.Table, Mapping[str, Any]]:
        if not args:
            return run.rowset.table(reads), run.values
        params = dict(run.values)
        for arg, spec in args.items():
            if "const" in spec:
                params[arg] = spec["const"]
            else:
                resolved = run.params.get(spec["param"])
                if resolved is None:
                    raise ValidationError(
                        "reference",
                        f"argument {arg!r} reads param {spec['param']!r}, which has no value",
                        node_id=key,
                    )
                params[arg] = resolved[0]
        return run.rowset.table(reads), MappingProxyType(params)

    # Writes that do not depend on params are known now: no evaluation per call.
    fixed = task.writes if isinstance(task.writes, tuple) else None
    exact = None if fixed is None else frozenset(fixed)

    def apply(run: _Run, out: Any, params: Mapping[str, Any]) -> None:
        _apply(registry, task, run.rowset, out, params, exact)

    if not task.is_async and timeout is None and not bounded:
        # No deadline can bound it (none around the run, no region, no timeout of its own):
        # nothing to stop waiting for, so it runs on the loop, the cheapest way.
        def sync_action(run: _Run) -> None:
            rows, params = context(run)
            out = fn(TaskContext(params, current_deadline(), rows.num_rows), rows)
            _refuse_awaitable(task, out)
            apply(run, out, params)

        return sync_action, False

    async def call(ctx: TaskContext, rows: pa.Table) -> Any:
        if ctx.deadline.is_never:
            out = fn(ctx, rows)  # nothing bounds it: nothing to stop waiting for
            return await out if task.is_async else out
        # D5.7, D5.8: the region (or any deadline) stops waiting at once, even for a task that
        # cannot be cancelled; what such a task returns later is dropped.
        if task.is_async:
            return await await_abandonable(fn(ctx, rows), task.name, on_abandon)
        return await run_in_worker(fn, (ctx, rows), task.name, on_abandon)

    async def action(run: _Run) -> None:
        rows, params = context(run)
        if timeout is None:
            out = await call(TaskContext(params, current_deadline(), rows.num_rows), rows)
        else:
            async with fail_after(timeout, source="node", what=f"task {task.name}"):
                out = await call(TaskContext(params, current_deadline(), rows.num_rows), rows)
        if not task.is_async:
            _refuse_awaitable(task, out)
        apply(run, out, params)

    return action, True


def _refuse_awaitable(task: TaskSpec, out: Any) -> None:
    if type(out) is not dict and inspect.isawaitable(out):
        if inspect.iscoroutine(out):
            out.close()  # never awaited: closed here, not warned about later
        raise TaskError(f"task {task.name!r} is sync but returned an awaitable", task=task.name)


def _apply(
    registry: Catalog,
    task: TaskSpec,
    rs: RowSet,
    out: Any,
    params: Mapping[str, Any],
    exact: frozenset[str] | None,
) -> None:
    """Check a task's output against its spec, then write every column (all or nothing)."""
    name = task.name
    if type(out) is not dict and not isinstance(out, Mapping):
        raise TaskError(
            f"task {name!r} returned {type(out).__name__}; a task returns {{key: column}}",
            task=name,
        )
    declared = exact
    if declared is None:
        writes = evaluate(task.writes, params)
        declared = writes.keys if writes.kind == "exact" else None
    if declared is not None and out.keys() != declared:
        for k in sorted(declared - set(out)):
            raise TaskError(f"task {name!r} did not return key {k!r}", task=name, key=k)
        for k in sorted(set(out) - declared, key=str):
            raise TaskError(
                f"task {name!r} returned key {k!r} it does not declare", task=name, key=str(k)
            )
    n = rs.active_count
    checked: dict[str, pa.Array] = {}
    for k, column in out.items():
        kdef = registry.keys.get(k) if isinstance(k, str) else None
        if kdef is None:
            raise TaskError(f"task {name!r} returned unknown key {k!r}", task=name, key=str(k))
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not isinstance(column, pa.Array):
            raise TaskError(
                f"task {name!r}, key {k!r}: a column must be a pyarrow Array, got "
                f"{type(column).__name__}",
                task=name,
                key=k,
            )
        if len(column) != n:
            raise TaskError(
                f"task {name!r}, key {k!r}: {len(column)} values for {n} rows", task=name, key=k
            )
        if not column.type.equals(kdef.type):
            raise TaskError(
                f"task {name!r}, key {k!r}: column is {column.type}, the key holds {kdef.type}",
                task=name,
                key=k,
            )
        if not kdef.nullable and column.null_count:
            raise TaskError(
                f"task {name!r}, key {k!r}: nulls in a non-nullable key", task=name, key=k
            )
        checked[k] = column
    for k, column in checked.items():
        rs.write(k, column)
