"""The worst-case time check of a Constellation program (D14.4).

The program is read by the language's own parser, and each call's ``with`` options by the
compiler's reading of them (:meth:`CallOptions.of`, the option table's converters): each call
site's retry loop is the :class:`~timebound.policies.Policy` the compiler would build, checked
as a Python policy is, under the run's budget (``--budget``, what ``timebound run --timeout``
gives). The program's worst case is its longest chain of calls: a call waits for the calls its
arguments read, then takes its own worst case and, when every attempt failed, its fallback's.
Values computed side by side take the longer of the two.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..dsl import CallOptions, CompileError, Diagnostic
from ..dsl import _ast as A
from ..dsl._lexer import ParseFailure
from ..dsl._options import OPTIONS
from ..dsl._parser import parse
from ..policies import Policy
from ._findings import Finding, Location, Report, shown
from ._retries import retry_findings, worst_case

__all__ = ["check_constellation"]

# The options that shape a call's time; the others (cache, throttle, …) do not bound it.
_TIMING = ("timeout", "retry", "delay", "backoff", "reserve")


def _policy(call: A.Call, options: CallOptions) -> Policy[Any]:
    """The call site's policy as far as time goes, built as the compiler builds it."""
    kwargs: dict[str, Any] = {}
    for name in options.declared:
        to_policy = OPTIONS[name].policy
        if name in _TIMING and to_policy is not None:
            kwargs[name] = to_policy(getattr(options, name))
    if isinstance(options.timeout, str):
        # A learned timeout (`timeout: p99`, D3.16) is not known before the run: the attempt is
        # bounded by the deadline it runs under only.
        del kwargs["timeout"]
    if options.fallback:
        kwargs["fallback"] = None
    return Policy(call.module, **kwargs)


class _Timing:
    """The worst-case finish time of each binding, and the chain of calls that decides it."""

    def __init__(self, decls: list[A.Decl], budget: float | None, file: str) -> None:
        self.budget = budget
        self.file = file
        self.bound: dict[str, tuple[float, tuple[str, ...]]] = {}
        self.findings: list[Finding] = []
        for decl in decls:
            if isinstance(decl, A.Assign):
                self.bound[decl.name] = self.expr(decl.expr)

    def expr(self, root: A.Expr) -> tuple[float, tuple[str, ...]]:
        """When ``root`` is ready at the latest, and the calls on its longest chain. Walked
        without recursion: children first, from an explicit stack."""
        done: dict[int, tuple[float, tuple[str, ...]]] = {}
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            item, expanded = stack.pop()
            kids = _children(item)
            if not expanded and kids:
                stack.append((item, True))
                stack.extend((k, False) for k in kids)
                continue
            ready = max((done[id(k)] for k in kids), key=lambda t: t[0], default=(0.0, ()))
            if isinstance(item, A.Name) and item.name in self.bound:
                ready = max(ready, self.bound[item.name], key=lambda t: t[0])
            if isinstance(item, A.Call):
                ready = self.call(item, ready)
            done[id(item)] = ready
        return done[id(root)]

    def call(
        self, call: A.Call, ready: tuple[float, tuple[str, ...]]
    ) -> tuple[float, tuple[str, ...]]:
        options = CallOptions.of({k: v for k, v in call.options.items()})
        line, column = call.pos
        policy = _policy(call, options)
        if any(name in options.declared for name in (*_TIMING, "fallback")):
            self.findings += retry_findings(
                policy.plan,
                policy.timeout,
                caller=self.budget,
                fallback=options.fallback,
                subject=f"{call.module} at {line}:{column}",
                where=_at(self.file, call, "retry"),
                timeout_where=_at(self.file, call, "timeout"),
                site=Location(file=self.file, line=line, column=column),
                reserve=policy.reserve,
                reserve_where=_at(self.file, call, "reserve"),
            )
        took = worst_case(policy.plan, policy.timeout, None)
        fallback = call.options.get("fallback")
        if fallback is not None:
            took += self.expr(fallback.value)[0]  # after every attempt failed (D3.4)
        return ready[0] + took, (*ready[1], f"{call.module} ({line}:{column})")


def _children(item: Any) -> list[Any]:
    """The expressions ``item`` waits for: its arguments (a call's fallback is counted by
    the call itself, after its attempts)."""
    if isinstance(item, A.Call):
        return list(item.args)
    out: list[Any] = []
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        for f in dataclasses.fields(item):
            value = getattr(item, f.name)
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, tuple):
                    out += [x for x in v if isinstance(x, A.Expr | A.MatchCase)]
                elif isinstance(v, A.Expr | A.MatchCase):
                    out.append(v)
    return out


def _at(file: str, call: A.Call, option: str) -> Location:
    """Where ``option`` of ``call`` is written (the call itself when it is not)."""
    opt = call.options.get(option)
    line, column = call.pos if opt is None else opt.pos
    return Location(file=file, line=line, column=column, parameter=option)


def check_constellation(
    source: str, *, budget: float | None = None, file: str = "<program>"
) -> Report:
    """The findings of a Constellation program; ``budget`` is the run's budget in seconds.

    Raises :class:`~timebound.dsl.CompileError` when the program does not parse.
    """
    source = source.removeprefix("\ufeff")
    diags: list[Diagnostic] = []
    try:
        tree = parse(source, diags)
    except ParseFailure as exc:
        raise CompileError([exc.diag], source) from None
    except RecursionError:
        raise CompileError(
            [Diagnostic("E004", "error", "Program nested too deeply", 1, 1)], source
        ) from None
    errors = [d for d in diags if d.severity == "error"]
    if errors:
        raise CompileError(errors, source)
    timing = _Timing(tree.decls, budget, file)
    findings = timing.findings
    if timing.bound:
        name, (worst, chain) = max(timing.bound.items(), key=lambda kv: kv[1][0])
        where = Location(file=file, line=1, column=1)
        chain_text = " -> ".join(chain)
        # Only a bounded chain has a worst case worth stating: one with a call without a
        # timeout runs until the run's deadline, which is no contradiction.
        if len(chain) > 1 and math.isfinite(worst):
            findings.append(
                Finding(
                    "TB-T030",
                    "the program",
                    f"worst case {shown(worst)}: the longest chain of calls, {chain_text}, "
                    f"ends with '{name}'",
                    where,
                    numbers={"worst_case": worst},
                )
            )
        if len(chain) > 1 and budget is not None and math.isfinite(worst) and worst > budget:
            findings.append(
                Finding(
                    "TB-T031",
                    "the program",
                    f"the worst case ({shown(worst)}, {chain_text}) is above the run's budget "
                    f"of {shown(budget)}: the run's deadline may cut these calls",
                    where,
                    "give every call on the chain a timeout, and size retries so the chain fits",
                    {"worst_case": worst, "budget": budget},
                )
            )
    return Report.of("constellation", file, findings, budget)
