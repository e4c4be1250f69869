"""The lower pass: a checked program's typed representation (``_ir.py``) in, the runnable
:class:`~timebound.dsl.Program` out. It reports no diagnostic: the check pass has reported every
one, and only a program without errors is lowered.

Every expression becomes a closure ``fn(run) -> value`` (an ``async`` one when it must await: it
forces a lazy value or makes a call in place), built once here so a run only calls closures.
A module call becomes a :class:`~timebound.dsl._runtime.CompiledCall` with its call site's one
:class:`~timebound.policies.Policy` (the program's own limiters and caches, D3.6, D3.7), placed
as the check decided: a DAG node of its own, a lazy thunk, or a closure run in place. A binding
that is not a call's own node is a DAG node of its own; a lazy output is forced by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._engine import DagPlan, Node
from . import _ir as I
from ._calls import policy_keywords
from ._diagnostics import Diagnostic
from ._lower_expr import Closure, lower_expr
from ._registry import ModuleRegistry, ModuleSpec
from ._resources import ProgramResources
from ._runtime import (
    CURRENT_RUN,
    Annotation,
    CallSite,
    CompiledCall,
    Program,
    _Run,
    lazy_ref,
)
from ._stdlib import standard_library

__all__ = ["Lowering", "lower_program"]


class Lowering:
    """What lowering one program collects: its DAG nodes, lazy calls and call sites, and the
    caches and limiters its call sites share."""

    def __init__(self, registry: ModuleRegistry) -> None:
        self.registry = registry
        self.nodes: list[Node[_Run]] = []
        self.lazy: list[tuple[str, CompiledCall]] = []
        self.sites: dict[str, CallSite] = {}
        # Call nodes' actions for untraced runs (CompiledCall.fast_action), by node key.
        self.fast: dict[str, Callable[[_Run], Any]] = {}
        # The program's own caches and limiters, shared by its call sites (D3.6, D3.7).
        self.resources = ProgramResources(registry)

    def binding(self, b: I.Binding) -> None:
        x = b.expr
        lowered = lower_expr(self, x)
        if isinstance(x, I.Call) and x.node.key == b.key:
            return  # the call's own node (or thunk) is the binding's
        # The executor stores each node's value under its key in run.env (results=env).
        self.nodes.append(Node(b.key, lowered.fn, tuple(sorted(x.deps)), 50, lowered.is_async))

    def output(self, o: I.Output) -> None:
        if not o.lazy:
            return
        # A lazy output is needed: force it (concurrently with the rest) and store the value.
        key, ref = o.key, lazy_ref(o.key)

        async def force(run: _Run) -> None:
            run.env[key] = await ref(run)
            # returns None: the executor stores it under "out:<name>", which nothing reads

        self.nodes.append(Node(f"out:{o.name}", force, tuple(sorted(o.deps)), 50, True))

    def call(self, x: I.Call) -> Closure:
        """Build the runnable call of a checked node: its policy, its compiled call, and its
        place in the DAG (a node, a thunk, or a closure evaluated in place)."""
        node = x.node
        spec = self.registry.get(node.module) or standard_library()[node.module]
        args = [lower_expr(self, a) for a in x.args]
        fallback = None if x.fallback is None else lower_expr(self, x.fallback)
        fn = _callable(spec)
        policy = self.policy(node, spec, fallback)
        if policy is not None and policy.hedge is not None and not spec.is_async:
            # D3.16: a hedged sync module races its attempts in threads (D3.14) while the call
            # awaits them: the event loop goes on meanwhile.
            from ..policies._hedge import race_in_threads

            fn = race_in_threads(fn)
        cc = CompiledCall(
            node=node,
            fn=fn,
            is_async=spec.is_async,
            args=[(a.is_async, a.fn, a.key) for a in args],
            policy=policy,
        )
        node_key = node.key
        if node.placement == "inline":
            return Closure(cc.invoke, True)
        if node.placement == "thunk":
            self.lazy.append((node_key, cc))
            return Closure(lazy_ref(node_key), True)
        priority = node.options.priority
        if cc.sync_node:
            dag_node = Node(node_key, cc.call_now, node.deps, priority, False)
        else:
            dag_node = Node(node_key, cc.start, node.deps, priority, True)
        self.nodes.append(dag_node)
        self.fast[node_key] = cc.fast_action()
        self.sites[node_key] = node.site
        return Closure(lambda run: run.env[node_key], False, node_key)

    def policy(self, node: I.CallNode, spec: ModuleSpec, fallback: Closure | None) -> Any:
        """One Policy per call site (the check built it once already), or None for a call
        without resilience options."""
        kwargs = policy_keywords(node, spec)
        if kwargs is None:
            return None
        from ..policies import Policy

        # The program's own limiters, shared by every call site of one module (D3.7).
        options = node.options
        res = self.resources
        if options.throttle is not None:
            count, per, _ = options.throttle
            kwargs["throttle"] = res.bucket(spec.name, count, per)
        if options.concurrency is not None:
            kwargs["concurrency"] = res.slots(spec.name, options.concurrency)
        if fallback is not None:
            kwargs["fallback"] = _fallback_callable(fallback)
        if options.cache is not None:
            kwargs["cache_backend"] = res.cache(spec.name, options.cache_backend)
        return Policy(**kwargs)


def _callable(spec: ModuleSpec) -> Callable[..., Any]:
    """The module's function, with its arguments' and result's record conversions."""
    fn = spec.fn
    convs = spec.arg_converters
    rconv = spec.result_converter
    if not any(convs) and rconv is None:
        return fn
    if spec.is_async:

        async def aconverted(*args: Any) -> Any:
            r = await fn(*(c(a) if c else a for c, a in zip(convs, args, strict=True)))
            return rconv(r) if rconv else r

        return aconverted

    def converted(*args: Any) -> Any:
        r = fn(*(c(a) if c else a for c, a in zip(convs, args, strict=True)))
        return rconv(r) if rconv else r

    return converted


def _fallback_callable(fallback: Closure) -> Callable[..., Any]:
    """The fallback as the policy wants it: a callable taking the module's arguments. It reads
    the run from the context (the expression may use any value of the program)."""
    fn = fallback.fn
    if fallback.is_async:

        async def afb(*_args: Any, **_kwargs: Any) -> Any:
            return await fn(CURRENT_RUN.get())

        return afb

    def fb(*_args: Any, **_kwargs: Any) -> Any:
        return fn(CURRENT_RUN.get())

    return fb


def _constant_value(lw: Lowering, x: I.Expr) -> Any:
    """The value of an annotation's constant expression."""
    return lower_expr(lw, x).fn(_Run({}, None, 0.0))


def lower_program(
    ir: I.ProgramIR, registry: ModuleRegistry, source: str, warnings: list[Diagnostic]
) -> Program:
    """The runnable program of ``ir`` (checked, without errors) against ``registry``."""
    lw = Lowering(registry)
    for b in ir.bindings:
        lw.binding(b)
    for o in ir.results:
        lw.output(o)
    nodes = lw.nodes
    plan: DagPlan[_Run] = DagPlan(nodes)
    fast_plan: DagPlan[_Run] = DagPlan(
        [
            Node(n.key, lw.fast[n.key], n.deps, n.priority, n.is_async) if n.key in lw.fast else n
            for n in nodes
        ]
    )
    annotations = {
        name: tuple(
            Annotation(
                a.kind,
                tuple(_constant_value(lw, v) for v in a.values),
                {k: _constant_value(lw, v) for k, v in a.props},
            )
            for a in found
        )
        for name, found in ir.annotations.items()
    }
    return Program(
        inputs=dict(ir.inputs),
        outputs=dict(ir.outputs),
        warnings=warnings,
        plan=plan,
        fast_plan=fast_plan,
        lazy=lw.lazy,
        output_keys=[(o.name, o.key) for o in ir.results],
        sites=lw.sites,
        source=source,
        examples={name: _constant_value(lw, x) for name, x in ir.examples.items()},
        annotations=annotations,
        ir=ir,
    )
