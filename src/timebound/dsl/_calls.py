"""Calls: resolving a call's module, checking its arguments and options, and lowering it to a
policy, a compiled call and a place in the DAG (a node, a lazy thunk, or a closure run in place).

The compiler (``_compiler.py``) mixes :class:`CallLowering` in, as it does the expression forms;
the scopes, diagnostics and collected nodes it reads are the compiler's.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from .._core._errors import ConfigurationError
from .._engine import Node
from . import _ast as A
from ._diagnostics import Diagnostic
from ._forms import CE, ExpressionForms, _start
from ._ir import CallNode, CallOptions
from ._options import OPTIONS
from ._registry import ModuleSpec
from ._runtime import CURRENT_RUN, CallSite, CompiledCall, ProgramResources, _Run, lazy_ref
from ._types import ERROR, ResultType, Type, is_assignable, zero_value

__all__ = ["CallLowering"]


class CallLowering(ExpressionForms):
    """Module calls; mixed into the compiler, which provides what is declared below."""

    diags: list[Diagnostic]
    aliases: dict[str, str]
    nodes: list[Node[_Run]]
    lazy: list[tuple[str, CompiledCall]]
    sites: dict[str, CallSite]
    calls: list[CallNode]
    fast: dict[str, Callable[[_Run], Any]]
    limits: dict[tuple[str, str], tuple[Any, A.Pos]]
    resources: ProgramResources

    def warn(self, code: str, message: str, pos: A.Pos) -> None:
        raise NotImplementedError

    def known(self) -> list[str]:
        raise NotImplementedError

    def lookup(self, name: str) -> ModuleSpec | str | None:
        raise NotImplementedError

    def candidates(self, name: str) -> list[str]:
        raise NotImplementedError

    def resolve_module(self, e: A.Call) -> ModuleSpec | str | None:
        """The module (or higher-order function's kind) ``e`` calls; None after an E009."""
        found = self.candidates(e.module)
        if len(found) == 1:
            return self.lookup(found[0])
        if found:
            self.error(
                "E009",
                f"'{e.module}' is ambiguous: it may be {' or '.join(found)} (write the qualified "
                "name, or 'use' one namespace)",
                e.module_pos,
            )
            return None
        simple = e.module.rpartition(".")[2]
        elsewhere = [q for q in self.known() if q.rpartition(".")[2] == simple]
        if elsewhere and "." not in e.module:
            spaces = " or ".join(f"'use {q.rpartition('.')[0]}'" for q in elsewhere if "." in q)
            hint = f" (it is {' or '.join(elsewhere)}: add {spaces})" if spaces else ""
        else:
            # Suggest by simple name too: `filtr` is close to `filter`, not to its qualified name.
            known = self.known()
            by_simple = {q.rpartition(".")[2]: q for q in reversed(known)}
            close = difflib.get_close_matches(e.module, [*known, *self.aliases, *by_simple], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
        self.error("E009", f"Unknown module '{e.module}'{hint}", e.module_pos)
        return None

    def call(self, e: A.Call, *, lifted: bool, key: str | None) -> CE | None:
        target = self.resolve_module(e)
        if isinstance(target, str):
            return self.higher_order(e, target, lifted)
        spec = target
        lazy_opt = e.options.get("lazy")
        # A lazy call's arguments are computed only when the call is: calls inside them are
        # not lifted into eager nodes of their own.
        lift_args = lifted and not (lazy_opt is not None and lazy_opt.value is True)
        if spec is None:
            # The call's own error is reported; its arguments still get theirs (a lambda has
            # nothing to say about an unknown function: it is skipped).
            for arg in e.args:
                if not isinstance(arg, A.Lambda):
                    self.expr(arg, lifted=lift_args)
            self.check_options(e, None, ERROR)
            return None
        args = [self.expr(a, lifted=lift_args) for a in e.args]
        if len(args) != spec.arity:
            self.error(
                "E010",
                f"Module '{spec.name}' takes {spec.arity} argument{'s' * (spec.arity != 1)} but "
                f"{len(args)} {'was' if len(args) == 1 else 'were'} given",
                e.pos,
            )
        else:
            for i, (a, ae, (pname, pt)) in enumerate(
                zip(args, e.args, spec.params, strict=True), 1
            ):
                if not is_assignable(a.type, pt):
                    self.error(
                        "E011",
                        f"Argument {i} ('{pname}') of '{spec.name}' expects {pt}, got {a.type}",
                        _start(ae),
                    )
        result_type = spec.returns
        fallback = self.check_options(e, spec, result_type)
        options = CallOptions.of(e.options)
        if options.on_error == "wrap":
            result_type = ResultType(spec.returns)
        deps = frozenset().union(*(a.deps for a in args))
        if fallback is not None:
            deps |= fallback.deps
        self.check_shared_limits(spec.name, e)
        node = CallNode(
            key=key or self.new_key(),
            module=spec.name,
            site=CallSite(spec.name, e.module_pos[0], e.module_pos[1]),
            params=tuple(a.type for a in args),
            returns=result_type,
            options=options,
            deps=tuple(sorted(deps)),
            placement=("thunk" if options.lazy else "node") if lifted else "inline",
            positions={name: opt.value_pos for name, opt in e.options.items()},
        )
        self.calls.append(node)
        return self.lower(node, spec, args, fallback, e.pos)

    def lower(
        self, node: CallNode, spec: ModuleSpec, args: list[CE], fallback: CE | None, pos: A.Pos
    ) -> CE:
        """Build the runnable call of a checked node: its policy, its compiled call, and its
        place in the DAG (a node, a thunk, or a closure evaluated in place)."""
        fn = self._callable(spec)
        is_async = spec.is_async
        policy = self.policy(node, spec, fallback, pos)
        if policy is not None and policy.hedge is not None and not is_async:
            # D3.16: a hedged sync module races its attempts in threads (D3.14) while the call
            # awaits them: the event loop goes on meanwhile.
            from ..policies._hedge import race_in_threads

            fn = race_in_threads(fn)
        cc = CompiledCall(
            node=node,
            fn=fn,
            is_async=is_async,
            args=[(a.is_async, a.fn, a.key) for a in args],
            policy=policy,
        )
        node_key = node.key
        deps = frozenset(node.deps)
        if node.placement == "inline":
            return CE(node.returns, cc.invoke, True, deps)
        if node.placement == "thunk":
            self.lazy.append((node_key, cc))
            return CE(node.returns, lazy_ref(node_key), True, deps)
        priority = node.options.priority
        if cc.sync_node:
            dag_node = Node(node_key, cc.call_now, node.deps, priority, False)
        else:
            dag_node = Node(node_key, cc.start, node.deps, priority, True)
        self.nodes.append(dag_node)
        self.fast[node_key] = cc.fast_action()
        self.sites[node_key] = node.site
        return CE(
            node.returns, lambda run: run.env[node_key], False, frozenset({node_key}), node_key
        )

    @staticmethod
    def _callable(spec: ModuleSpec) -> Callable[..., Any]:
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

    def check_options(self, e: A.Call, spec: ModuleSpec | None, ret: Type) -> CE | None:
        """D3.9 checks and warnings; compiles the fallback (in a conditional position)."""
        opts = e.options
        fallback: CE | None = None
        if "fallback" in opts:
            fo = opts["fallback"]
            fallback = self.expr(fo.value, lifted=False)
            if spec is not None and not is_assignable(fallback.type, ret):
                self.error(
                    "E017",
                    f"Fallback type mismatch: module returns {ret} but fallback is {fallback.type}",
                    fo.value_pos,
                )
        retry = opts["retry"].value if "retry" in opts else 0
        if "delay" in opts and retry == 0:
            self.warn("W001", "'delay' without 'retry' has no effect", opts["delay"].pos)
        if "backoff" in opts and "delay" not in opts:
            self.warn("W002", "'backoff' without 'delay' has no effect", opts["backoff"].pos)
        if "backoff" in opts and retry == 0:
            self.warn("W003", "'backoff' without 'retry' has no effect", opts["backoff"].pos)
        if "cache_backend" in opts and "cache" not in opts:
            self.warn(
                "W004", "'cache_backend' without 'cache' has no effect", opts["cache_backend"].pos
            )
        if retry > 10:
            self.warn(
                "W005",
                f"High retry count ({retry}) - consider using a lower value with exponential "
                "backoff",
                opts["retry"].pos,
            )
        return fallback

    def policy(self, node: CallNode, spec: ModuleSpec, fallback: CE | None, pos: A.Pos) -> Any:
        """One Policy per call site, or None for a call without resilience options."""
        options = node.options
        # D3.16: a module registered with a breaker or a retry budget is never called around
        # them, with or without options of its own.
        shared = spec.breaker is not None or spec.retry_budget is not None
        needed = (
            shared
            or options.fallback
            or any(OPTIONS[n].policy is not None for n in options.declared)
        )
        if not needed or any(d.severity == "error" for d in self.diags):
            return None  # no policy needed (or the program will not compile anyway)
        from ..policies import Policy

        # The options that map one-to-one, through the option table's converters.
        kwargs: dict[str, Any] = {"name": spec.name}
        for name in options.declared:
            to_policy = OPTIONS[name].policy
            if to_policy is not None:
                kwargs[name] = to_policy(getattr(options, name))
        # The program's own limiters, shared by every call site of one module (D3.7).
        res = self.resources
        if options.throttle is not None:
            count, per, _ = options.throttle
            kwargs["throttle"] = res.bucket(spec.name, count, per)
        if options.concurrency is not None:
            kwargs["concurrency"] = res.slots(spec.name, options.concurrency)
        if spec.breaker is not None:
            kwargs["breaker"] = spec.breaker
        if spec.retry_budget is not None:
            kwargs["retry_budget"] = spec.retry_budget
        if "on_error" in options.declared:
            kwargs["zero"] = zero_value(spec.returns)
        if fallback is not None:
            kwargs["fallback"] = _fallback_callable(fallback)
        try:
            if options.cache is not None:
                kwargs["cache_backend"] = res.cache(spec.name, options.cache_backend)
            else:
                kwargs.pop("cache_backend", None)  # W004: no cache, no backend to look up
            return Policy(**kwargs)
        except ConfigurationError as exc:
            # Point at the option the policy refused (an unknown cache_backend...) when it
            # says which one; otherwise at the call.
            where = node.positions.get(getattr(exc, "option", None) or "", pos)
            self.error("E013", f"Invalid options for '{spec.name}': {exc}", where)
            return None

    def check_shared_limits(self, module: str, e: A.Call) -> None:
        """D3.7: throttle and concurrency are per module name, shared by every call site, so
        call sites of one module must not declare different limits (which one would bind?)."""
        for option in ("throttle", "concurrency"):
            if option not in e.options:
                continue
            opt = e.options[option]
            value = opt.value[:2] if option == "throttle" else opt.value
            first = self.limits.setdefault((module, option), (value, opt.value_pos))
            if first[0] != value:
                line, col = first[1]
                self.error(
                    "E013",
                    f"Conflicting '{option}' for '{module}': every call site of a module shares "
                    f"one limiter, and line {line}, column {col} already declares a different one",
                    opt.value_pos,
                )


def _fallback_callable(fallback: CE) -> Callable[..., Any]:
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
