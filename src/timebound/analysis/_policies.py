"""The worst-case time check of Python policies: a :class:`~timebound.policies.Policy`, a
function decorated with :func:`~timebound.resilient`, or every one of them in a module (D14.3).

A finding about a policy points at the function it decorates (``file:line``) and names the
option it is about (``retry``, ``timeout``, ``total_timeout``); a policy held in a module variable
is named by that variable.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Any

from ..policies import MISSING, Policy
from ._findings import Finding, Location, Report
from ._retries import retry_findings

__all__ = ["check_module", "check_policy", "policies_of"]


def _policy_of(obj: Any) -> Policy[Any] | None:
    if isinstance(obj, Policy):
        return obj
    policy = getattr(obj, "policy", None) if callable(obj) else None
    return policy if isinstance(policy, Policy) else None


def _where(obj: Any, label: str | None) -> Location:
    """The function's file and line when ``obj`` is a decorated function, else ``label``."""
    fn = inspect.unwrap(obj) if callable(obj) and not isinstance(obj, Policy) else None
    if fn is not None:
        try:
            file = inspect.getsourcefile(fn)
            _, line = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            file, line = None, None
        if file is not None:
            return Location(file=file, line=line, parameter=label)
    return Location(parameter=label)


def check_policy(obj: Any, *, budget: float | None = None, name: str | None = None) -> Report:
    """The findings of one policy (a ``Policy`` or a function decorated with ``resilient``);
    ``budget`` is the caller's budget in seconds, if the policy runs under a known one."""
    policy = _policy_of(obj)
    if policy is None:
        raise TypeError(
            f"expected a Policy or a function decorated with timebound.resilient, got {obj!r}"
        )
    findings = _findings(policy, obj, name, budget)
    return Report.of("policy", name or policy.name, findings, budget)


def _findings(
    policy: Policy[Any], obj: Any, label: str | None, budget: float | None
) -> list[Finding]:
    subject = label or policy.name
    where = _where(obj, None)
    return retry_findings(
        policy.plan,
        policy.timeout,
        caller=budget,
        fallback=policy.fallback is not MISSING,
        subject=subject,
        where=Location(where.file, where.line, where.column, parameter="retry"),
        timeout_where=Location(where.file, where.line, where.column, parameter="timeout"),
        reserve=policy.reserve,
        reserve_where=Location(where.file, where.line, where.column, parameter="reserve"),
    )


def policies_of(module: types.ModuleType) -> Iterator[tuple[str, Any, Policy[Any]]]:
    """``(name, object, policy)`` for each module-level policy or decorated function, and for
    the decorated methods of module-level classes, in definition order."""
    seen: set[int] = set()
    for name, value in list(vars(module).items()):
        found = [(name, value)]
        if isinstance(value, type) and value.__module__ == module.__name__:
            found = [(f"{name}.{k}", v) for k, v in vars(value).items()]
        for label, obj in found:
            target = obj.__func__ if isinstance(obj, staticmethod | classmethod) else obj
            policy = _policy_of(target)
            if policy is None or id(policy) in seen:
                continue
            seen.add(id(policy))
            yield label, target, policy


def check_module(module: types.ModuleType, *, budget: float | None = None) -> Report:
    """The findings of every ``resilient`` policy of ``module`` (see :func:`policies_of`)."""
    findings: list[Finding] = []
    for label, obj, policy in policies_of(module):
        findings += _findings(policy, obj, f"{module.__name__}.{label}", budget)
    return Report.of("policy", module.__name__, findings, budget)
