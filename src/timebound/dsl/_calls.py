"""Module calls in the check pass: resolving a call's module, checking its arguments and its
options, and the keywords of the call site's :class:`~timebound.policies.Policy` (which the check
validates and the lower pass builds the policy from).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._core._errors import ConfigurationError
from . import _ast as A
from . import _ir as I
from ._options import OPTIONS
from ._registry import ModuleSpec
from ._resources import resolve_cache_backend
from ._runtime import CallSite
from ._types import ERROR, ResultType, Type, is_assignable, zero_value

if TYPE_CHECKING:
    from ._check import Checker

__all__ = ["check_call", "policy_keywords"]


def resolve_module(c: Checker, e: A.Call) -> ModuleSpec | str | None:
    """The module (or higher-order function's kind) ``e`` calls; None after an E009."""
    found = c.candidates(e.module)
    if len(found) == 1:
        return c.lookup(found[0])
    if found:
        c.error(
            "E009",
            f"'{e.module}' is ambiguous: it may be {' or '.join(found)} (write the qualified "
            "name, or 'use' one namespace)",
            e.module_pos,
        )
        return None
    simple = e.module.rpartition(".")[2]
    elsewhere = [q for q in c.known() if q.rpartition(".")[2] == simple]
    if elsewhere and "." not in e.module:
        spaces = " or ".join(f"'use {q.rpartition('.')[0]}'" for q in elsewhere if "." in q)
        hint = f" (it is {' or '.join(elsewhere)}: add {spaces})" if spaces else ""
    else:
        # Suggest by simple name too: `filtr` is close to `filter`, not to its qualified name.
        known = c.known()
        by_simple = {q.rpartition(".")[2]: q for q in reversed(known)}
        close = difflib.get_close_matches(e.module, [*known, *c.aliases, *by_simple], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
    c.error("E009", f"Unknown module '{e.module}'{hint}", e.module_pos)
    return None


def check_call(c: Checker, e: A.Call, *, lifted: bool, key: str | None) -> I.Expr | None:
    """The typed call ``e`` (None after an unknown module): its node, arguments and fallback.

    A lifted call reads as its own node's value (or its thunk's); an inline one as the call.
    """
    target = resolve_module(c, e)
    if isinstance(target, str):
        return c.higher_order(e, target, lifted)
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
                c.expr(arg, lifted=lift_args)
        check_options(c, e, None, ERROR)
        return None
    args = tuple(c.expr(a, lifted=lift_args) for a in e.args)
    if len(args) != spec.arity:
        c.error(
            "E010",
            f"Module '{spec.name}' takes {spec.arity} argument{'s' * (spec.arity != 1)} but "
            f"{len(args)} {'was' if len(args) == 1 else 'were'} given",
            e.pos,
        )
    else:
        for i, (a, ae, (pname, pt)) in enumerate(zip(args, e.args, spec.params, strict=True), 1):
            if not is_assignable(a.type, pt):
                c.error(
                    "E011",
                    f"Argument {i} ('{pname}') of '{spec.name}' expects {pt}, got {a.type}",
                    A.start(ae),
                )
    result_type = spec.returns
    fallback = check_options(c, e, spec, result_type)
    options = I.CallOptions.of(e.options)
    if options.on_error == "wrap":
        result_type = ResultType(spec.returns)
    deps = frozenset().union(*(a.deps for a in args))
    if fallback is not None:
        deps |= fallback.deps
    check_shared_limits(c, spec.name, e)
    node = I.CallNode(
        key=key or c.new_key(),
        module=spec.name,
        site=CallSite(spec.name, e.module_pos[0], e.module_pos[1]),
        params=tuple(a.type for a in args),
        returns=result_type,
        options=options,
        deps=tuple(sorted(deps)),
        placement=("thunk" if options.lazy else "node") if lifted else "inline",
        positions={name: opt.value_pos for name, opt in e.options.items()},
    )
    c.calls.append(node)
    check_policy(c, node, spec, e.pos)
    if node.placement == "node":
        deps = frozenset({node.key})
    return I.Call(result_type, deps, node, args, fallback)


def check_options(c: Checker, e: A.Call, spec: ModuleSpec | None, ret: Type) -> I.Expr | None:
    """D3.9 checks and warnings; checks the fallback (in a conditional position)."""
    opts = e.options
    fallback: I.Expr | None = None
    if "fallback" in opts:
        fo = opts["fallback"]
        fallback = c.expr(fo.value, lifted=False)
        if spec is not None and not is_assignable(fallback.type, ret):
            c.error(
                "E017",
                f"Fallback type mismatch: module returns {ret} but fallback is {fallback.type}",
                fo.value_pos,
            )
    check_learned_timeout(c, opts)
    retry = opts["retry"].value if "retry" in opts else 0
    if "delay" in opts and retry == 0:
        c.warn("W001", "'delay' without 'retry' has no effect", opts["delay"].pos)
    if "backoff" in opts and "delay" not in opts:
        c.warn("W002", "'backoff' without 'delay' has no effect", opts["backoff"].pos)
    if "backoff" in opts and retry == 0:
        c.warn("W003", "'backoff' without 'retry' has no effect", opts["backoff"].pos)
    if "cache_backend" in opts and "cache" not in opts:
        c.warn("W004", "'cache_backend' without 'cache' has no effect", opts["cache_backend"].pos)
    if retry > 10:
        c.warn(
            "W005",
            f"High retry count ({retry}) - consider using a lower value with exponential backoff",
            opts["retry"].pos,
        )
    return fallback


def check_learned_timeout(c: Checker, opts: Mapping[str, A.Option]) -> None:
    """D3.16: a percentile timeout (``timeout: p99``) needs ``timeout_floor``, and
    ``timeout_floor`` means nothing without one (E013 either way, as Policy refuses it)."""
    timeout = opts.get("timeout")
    learned = timeout is not None and isinstance(timeout.value, str)
    floor = opts.get("timeout_floor")
    if timeout is not None and learned and floor is None:
        c.error(
            "E013",
            f"A learned timeout needs a floor: write 'timeout: {timeout.text}, "
            "timeout_floor: 50ms'",
            timeout.value_pos,
        )
    # A refused `timeout` value is not stored: with an error already reported, "no timeout"
    # may be that one, and one mistake gets one diagnostic.
    if floor is not None and not learned and (timeout is not None or not c.failed()):
        why = "a fixed timeout" if timeout is not None else "no timeout"
        c.error(
            "E013",
            f"'timeout_floor' applies to a learned timeout (a percentile such as p99) only; "
            f"this call has {why}",
            floor.pos,
        )


def needs_policy(options: I.CallOptions, spec: ModuleSpec) -> bool:
    """Whether a call of ``spec`` with ``options`` runs under a policy (a call without
    resilience options is made directly). D3.16: a module registered with a breaker or a retry
    budget is never called around them, with or without options of its own."""
    shared = spec.breaker is not None or spec.retry_budget is not None
    return (
        shared or options.fallback or any(OPTIONS[n].policy is not None for n in options.declared)
    )


def policy_keywords(node: I.CallNode, spec: ModuleSpec) -> dict[str, Any] | None:
    """The keywords of the call site's Policy that its options give, through the option table's
    converters (None: it needs no policy). The limiters, the cache's backend and the fallback
    are the lowering's to add: they are run-time objects."""
    options = node.options
    if not needs_policy(options, spec):
        return None
    kwargs: dict[str, Any] = {"name": spec.name}
    for name in options.declared:
        to_policy = OPTIONS[name].policy
        if to_policy is not None:
            kwargs[name] = to_policy(getattr(options, name))
    if spec.breaker is not None:
        kwargs["breaker"] = spec.breaker
    if spec.retry_budget is not None:
        kwargs["retry_budget"] = spec.retry_budget
    if "on_error" in options.declared:
        kwargs["zero"] = zero_value(spec.returns)
    kwargs.pop("cache_backend", None)  # W004: no cache, no backend to look up
    return kwargs


def check_policy(c: Checker, node: I.CallNode, spec: ModuleSpec, pos: A.Pos) -> None:
    """The call site's options must make a policy: checked by building it once, as the lower
    pass will (Policy's own checks say what it accepts), with the cache backend the registry
    names. Only in a program without errors so far (one that will be lowered); call sites of
    one module with the same options share the answer."""
    if not needs_policy(node.options, spec) or c.failed():
        return
    seen = (spec, node.options)
    if seen not in c.refusals:
        c.refusals[seen] = _refusal(c, node, spec)
    exc = c.refusals[seen]
    if exc is not None:
        # Point at the option the policy refused (an unknown cache_backend...) when it
        # says which one; otherwise at the call.
        where = node.positions.get(getattr(exc, "option", None) or "", pos)
        c.error("E013", f"Invalid options for '{spec.name}': {exc}", where)


def _refusal(c: Checker, node: I.CallNode, spec: ModuleSpec) -> ConfigurationError | None:
    """Why the call site's policy cannot be built (None: it can, or it needs none)."""
    kwargs = policy_keywords(node, spec)
    if kwargs is None:
        return None
    from ..policies import Policy

    options = node.options
    if options.fallback:
        kwargs["fallback"] = None
    # The limiters as numbers: the lower pass gives the program's own, shared by module (D3.7).
    if options.throttle is not None:
        kwargs["throttle"] = options.throttle[:2]
    try:
        if options.cache is not None:
            kwargs["cache_backend"] = resolve_cache_backend(c.registry, options.cache_backend)
        Policy(**kwargs)
    except ConfigurationError as exc:
        return exc
    return None


def check_shared_limits(c: Checker, module: str, e: A.Call) -> None:
    """D3.7: throttle and concurrency are per module name, shared by every call site, so
    call sites of one module must not declare different limits (which one would bind?)."""
    for option in ("throttle", "concurrency"):
        if option not in e.options:
            continue
        opt = e.options[option]
        value = opt.value[:2] if option == "throttle" else opt.value
        first = c.limits.setdefault((module, option), (value, opt.value_pos))
        if first[0] != value:
            line, col = first[1]
            c.error(
                "E013",
                f"Conflicting '{option}' for '{module}': every call site of a module shares "
                f"one limiter, and line {line}, column {col} already declares a different one",
                opt.value_pos,
            )
