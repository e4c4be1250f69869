"""The worst-case time check of a workflow definition (D14.6).

The definition is read and validated by the engine's own ``parse_definition``; its bounds are
the engine's: a node's timeout is the node's or its action's (``Definition.node_timeout_ms``), a
join's default is D6.2's ``sync_timeout_ms`` (with its inputs from ``sync_timeout_basis``), a
node's ``retry`` block is decided by the plan ``retry_plan`` builds. Every one of them starts
at or after the run's start, so one at or above the workflow timeout never fires (D6.4: a tie
goes to the workflow), and an ``on_timeout: retry`` attempt that starts at or after it never
runs.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from .._json import json_path
from ..workflow import Definition, parse_definition
from ..workflow._definition import default_sync_timeout_ms
from ..workflow._outcomes import retry_plan
from ._findings import Finding, Location, Report, shown
from ._retries import retry_findings

__all__ = ["check_workflow"]

#: A run holds at most this many tokens (D6.24): no fan-out is larger.
_MAX_FAN_OUT = 20_000


class _Places:
    """Where things are written in the definition, as JSON paths."""

    def __init__(self, definition: Definition, file: str | None) -> None:
        raw = definition.raw
        self.file = file
        self.nodes = {n["id"]: i for i, n in enumerate(raw.get("nodes", []))}
        self.actions = {a["id"]: i for i, a in enumerate(raw.get("actions", []))}
        self.transitions = {t["id"]: i for i, t in enumerate(raw.get("transitions", []))}
        self.raw = raw

    def at(self, *parts: str | int, parameter: str | None = None) -> Location:
        return Location(file=self.file, path=json_path(parts), parameter=parameter)

    def node_timeout(self, definition: Definition, node_id: str) -> Location:
        """The node's ``timeout_ms``, or its action's when the node does not set one."""
        node = definition.nodes[node_id]
        if node.timeout_set:
            return self.at("nodes", self.nodes[node_id], "timeout_ms")
        return self.at("actions", self.actions[node.action_id], "execution", "timeout_ms")


def _s(ms: float) -> float:
    return ms / 1000.0


def _workflow_bound(
    definition: Definition, budget: float | None, places: _Places
) -> tuple[float | None, str, Location]:
    """The bound of the whole run in ms, its name and where it is set."""
    own = definition.timeout_ms
    where = places.at("timeout_ms")
    if budget is not None and (own is None or budget * 1000 < own):
        return budget * 1000, "the caller's budget", Location(file=places.file, parameter="budget")
    if own is None:
        return None, "", where
    set_by = (
        "the workflow timeout" if "timeout_ms" in places.raw else "the default workflow timeout"
    )
    return float(own), set_by, where


def _reserve_finding(
    node_id: str, reserve: float, bound: float, name: str, places: _Places
) -> Finding:
    """TB-T032: a node starts at or after the run does, so a reserve at or above the run's
    bound is at least what is left whenever its handler starts: refused every time (D1.20,
    D6.32). The definition already refuses one at or above the node's own timeout."""
    i = places.nodes[node_id]
    node_raw = places.raw["nodes"][i]
    if "reserve_ms" in node_raw:
        where = places.at("nodes", i, "reserve_ms")
    else:
        action = places.actions[node_raw["action_id"]]
        where = places.at("actions", action, "execution", "reserve_ms")
    return Finding(
        "TB-T032",
        f"node {node_id}",
        f"the reserve of {shown(_s(reserve))} is at least {name} ({shown(_s(bound))}): the "
        "handler is refused at once every time it starts, and the node never runs it "
        "(D1.20, D6.32)",
        where,
        f"lower the reserve well below {shown(_s(bound))}, or raise {name}",
        {"reserve": _s(reserve), "budget": _s(bound)},
    )


def _nodes(definition: Definition, bound: float, name: str, places: _Places) -> list[Finding]:
    out: list[Finding] = []
    for node_id, node in definition.nodes.items():
        timeout = definition.node_timeout_ms(node)
        subject = f"node {node_id}"
        if node.reserve_ms and node.reserve_ms >= bound:
            out.append(_reserve_finding(node_id, node.reserve_ms, bound, name, places))
        if timeout is not None and timeout >= bound:
            out.append(
                Finding(
                    "TB-T010",
                    subject,
                    f"the node timeout of {shown(_s(timeout))} never fires: {name} "
                    f"({shown(_s(bound))}) always ends the run first (a tie goes to the "
                    "workflow, D6.4)",
                    places.node_timeout(definition, node_id),
                    f"lower the node timeout below {shown(_s(bound))}, or raise {name}",
                    {"timeout": _s(timeout), "budget": _s(bound)},
                )
            )
        elif timeout is not None and definition.node_on_timeout(node) == "retry":
            attempts = node.max_retries + 1
            # Each retry of a timed-out node starts at once with a fresh timeout: attempt k
            # starts (k - 1) timeouts after the node's first start, at the earliest at 0.
            k = max(math.ceil(bound / timeout), 1) + 1
            worst = min(attempts * timeout, bound)
            out.append(
                Finding(
                    "TB-T030",
                    subject,
                    f"worst case {shown(_s(worst))}: {attempts} attempts of "
                    f"{shown(_s(timeout))} (on_timeout: retry, max_retries "
                    f"{node.max_retries}), bounded by {name} ({shown(_s(bound))})",
                    places.at("nodes", places.nodes[node_id]),
                    numbers={"worst_case": _s(worst), "attempts": attempts},
                    counts=frozenset({"attempts"}),
                )
            )
            if k <= attempts:
                out.append(
                    Finding(
                        "TB-T002",
                        subject,
                        f"attempt {k} of {attempts} never starts after timed-out attempts: "
                        f"{k - 1} attempts of {shown(_s(timeout))} take "
                        f"{shown(_s((k - 1) * timeout))}, and {name} is {shown(_s(bound))}",
                        places.at("nodes", places.nodes[node_id], "max_retries"),
                        f"lower max_retries to {k - 2}, shorten the node timeout, or raise {name} "
                        f"above {shown(_s(attempts * timeout))}",
                        {
                            "attempt": k,
                            "attempts": attempts,
                            "timeout": _s(timeout),
                            "needed": _s((k - 1) * timeout),
                            "budget": _s(bound),
                        },
                        frozenset({"attempt", "attempts"}),
                    )
                )
        if node.retry is not None:
            plan = retry_plan(node.retry, f"workflow node '{node_id}'")
            found = retry_findings(
                plan,
                None if timeout is None else _s(timeout),
                caller=_s(bound),
                fallback=False,
                subject=subject,
                where=places.at("nodes", places.nodes[node_id], "retry"),
                budget_name=name,
                timeouts_retried=False,  # the retry block retries errors, not timeouts
            )
            for f in found:
                if f.code == "TB-T001":
                    k = int(f.numbers["attempt"] or 0)
                    fix = (
                        f"lower max_attempts to {k - 1}, shorten delay_ms or its backoff, or "
                        f"raise {name} above {shown(float(f.numbers['delays'] or 0))}"
                    )
                    out.append(dataclasses.replace(f, fix=fix))
    return out


def _rows_reaching(basis_ms: int | None, bound: float) -> int | None:
    """The smallest fan-out whose default join timeout (D6.2, the engine's formula) reaches
    ``bound`` ms, or ``None`` when none up to the largest possible does."""
    if default_sync_timeout_ms(basis_ms, _MAX_FAN_OUT) < bound:
        return None
    lo, hi = 1, _MAX_FAN_OUT
    while lo < hi:
        mid = (lo + hi) // 2
        if default_sync_timeout_ms(basis_ms, mid) >= bound:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _joins(
    definition: Definition, bound: float | None, name: str, places: _Places
) -> list[Finding]:
    out: list[Finding] = []
    for join in definition.transitions.values():
        sync = join.synchronization
        if sync is None:
            continue
        i = places.transitions[join.id]
        fan = definition.transitions[sync.sibling_group]
        subject = f"join {join.id}"
        where = places.at("transitions", i, "synchronization", "timeout_ms")
        if sync.timeout_ms is not None:
            if bound is not None and sync.timeout_ms >= bound:
                out.append(_always_cut(subject, sync.timeout_ms, bound, name, where, None))
            continue
        basis = definition.sync_timeout_basis(join)
        spawned = fan.spawn_count
        if basis is None:
            how = "no node of the branch has a timeout, so it is the cap"
            inputs: dict[str, float | int | None] = {"default": 1800.0}
        else:
            longest, node_id = basis
            count = f"spawnCount {spawned}" if spawned is not None else "spawnCount n (foreach)"
            how = (
                f"min(maxActionTimeout {shown(_s(longest))} (node {node_id}) x {count} x 1.5, "
                f"30min)"
            )
            inputs = {"max_action_timeout": _s(longest), "spawn_count": spawned}
        default = None if spawned is None else definition.sync_timeout_ms(join, spawned)
        if default is not None:
            inputs["default"] = _s(default)
        value = "" if default is None else f" = {shown(_s(default))}"
        out.append(
            Finding(
                "TB-T013",
                subject,
                f"no timeout_ms: the synchronization timeout is D6.2's default, {how}{value}",
                where,
                numbers=inputs,
                counts=frozenset({"spawn_count"}),
            )
        )
        if bound is None:
            continue
        if default is not None and default >= bound:
            out.append(_always_cut(subject, default, bound, name, where, how))
        elif default is None:
            n = _rows_reaching(None if basis is None else basis[0], bound)
            if n is not None:
                out.append(
                    Finding(
                        "TB-T012",
                        subject,
                        f"the default synchronization timeout ({how}) reaches {name} "
                        f"({shown(_s(bound))}) for fan-outs of {n:,} branches or more: the "
                        "workflow timeout then always cuts the join first",
                        where,
                        f"give the join a timeout_ms below {shown(_s(bound))}",
                        {"budget": _s(bound), "spawn_count": n},
                        frozenset({"spawn_count"}),
                    )
                )
    return out


def _always_cut(
    subject: str, timeout: float, bound: float, name: str, where: Location, how: str | None
) -> Finding:
    what = f"the synchronization timeout of {shown(_s(timeout))}"
    if how is not None:
        what += f" ({how})"
    return Finding(
        "TB-T011",
        subject,
        f"{what} never fires: its clock starts at the first sibling's arrival, after the run "
        f"started, and {name} ({shown(_s(bound))}) always ends the run first",
        where,
        f"give the join a timeout_ms below {shown(_s(bound))}, or raise {name}",
        {"timeout": _s(timeout), "budget": _s(bound)},
    )


def check_workflow(
    source: dict[str, Any] | str | Path | Definition,
    *,
    budget: float | None = None,
    file: str | None = None,
) -> Report:
    """The findings of a workflow definition (a dict, JSON/YAML text, a path, or a parsed
    ``Definition``); ``budget`` is the caller's budget in seconds (``start(deadline=…)``).

    Raises :class:`~timebound.workflow.DefinitionError` for a definition the engine refuses.
    """
    definition = source if isinstance(source, Definition) else parse_definition(source)
    places = _Places(definition, file)
    bound, name, _ = _workflow_bound(definition, budget, places)
    findings: list[Finding] = []
    if bound is not None:
        findings += _nodes(definition, bound, name, places)
    findings += _joins(definition, bound, name, places)
    return Report.of("workflow", file or definition.id, findings, budget)
