"""A ``timeout_wrapper`` region (RFC 0002, D5): its deadline, its transaction, its fallback.

Each wrapper becomes an executor group (:func:`region_group`) that owns the region deadline
(source ``region``): when it is entered it sizes the budget from the active rows
(:func:`region_budget`, D5.1) and opens a copy-on-write overlay of the rowset; when every member
finished in time it commits the overlay; on its own timeout it rolls the overlay back and fails
the plan or runs the fail branch, outside the expired region and under every enclosing bound
(D5.2), in an overlay of its own. Either branch must leave the rows, their selection and their
order as they were (:func:`check_preserved`).

A wrapper's ``reserve_ms`` (D5.9) is the group's reserve: the success branch sees the region's
effective deadline less it, and reaching that instant (or entering with no more than the reserve
left) is the region's timeout; the rollback and the fail branch then run in the reserve, bounded
by the region's own deadline, which fails the plan with :class:`PlanTimeout` if the fallback
does not end by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core import _clock
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from .._core._scopes import fail_at
from .._engine import DagPlan, Group
from ._errors import PlanTimeout, ValidationError
from ._rowset import RowSet

if TYPE_CHECKING:
    from ._engine import _Run

__all__ = ["RegionState", "check_preserved", "region_budget", "region_group"]


@dataclass
class RegionState:
    """A region of one run, from its entry: when, its budget, the rows it started with."""

    start: float
    timeout_ms: float
    index: Any
    nrows: int
    depth: int  # the overlay this wrapper opened


def region_group(
    node: Mapping[str, Any],
    key: str,
    deps: tuple[str, ...],
    parent: str | None,
    env: str,
    w_success: list[str],
    fail_plan: DagPlan[_Run],
) -> Group[_Run]:
    """The executor group of the wrapper ``node`` (executor key ``key``): the success branch's
    nodes join it; ``fail_plan`` is its fail branch, run by the fallback."""
    p = node["params"]
    budget = p["budget"]
    override = p.get("override")
    on_timeout = p["on_timeout"]
    reserve_ms: float | None = p.get("reserve_ms") or None
    node_id = key

    def enter(run: _Run) -> None:
        rs = run.rowset
        n = rs.active_count  # D5.4: the active rows when the wrapper starts
        timeout_ms, applied, origin = region_budget(
            budget, override, n, run.params, env, node, node_id
        )
        depth = rs.begin()
        run.wrappers[node_id] = RegionState(_clock.now(), timeout_ms, rs.index, n, depth)
        run.trace.wrappers[node_id] = {
            "timeout_ms": timeout_ms,
            "nrows": n,
            "success_elapsed_ms": None,
            "timed_out": False,
            "chosen_branch": None,
            "fail_elapsed_ms": None,
            "override_applied": applied,
            "override_origin": origin,
            "reserve_ms": reserve_ms,
            "w_success": w_success,
        }

    def success(run: _Run) -> None:
        state = run.wrappers[node_id]
        check_preserved(run.rowset, state, node_id, "success")
        run.rowset.commit()
        record = run.trace.wrappers[node_id]
        record["success_elapsed_ms"] = run.ms(_clock.now()) - run.ms(state.start)
        record["chosen_branch"] = "success"

    async def fallback(run: _Run) -> None:
        state = run.wrappers[node_id]
        # Also drops the overlays of wrappers nested in this one that were cut unsettled.
        run.rowset.rollback_to(state.depth)
        now = _clock.now()
        record = run.trace.wrappers[node_id]
        record["success_elapsed_ms"] = (now - state.start) * 1000.0
        record["timed_out"] = True
        record["chosen_branch"] = "fail_plan" if on_timeout == "fail_plan" else "fail"
        run.trace.timed_out(node_id)  # heard before the fallback runs (D10.11)
        own = Deadline(state.start + state.timeout_ms / 1000.0)
        if on_timeout == "fail_plan":
            raise PlanTimeout(
                None
                if reserve_ms is None
                else f"timeout_wrapper {node_id}'s success branch ran out of time before its "
                f"reserve of {reserve_ms:g} ms ({state.timeout_ms:g} ms budget)",
                node_id=node_id,
                timeout_ms=state.timeout_ms,
                trace=run.trace,
                deadline=own if reserve_ms is None else None,
                reserve_ms=reserve_ms,
            )
        depth = run.rowset.begin()
        spans, sink = run.trace.recording()
        try:
            if reserve_ms is None:
                await fail_plan.execute(run, record=spans, sink=sink)
            else:
                # D5.9: the fallback runs in the reserve, and the region ends at its deadline.
                with fail_at(own, source="region", what=f"region {node_id}"):
                    await fail_plan.execute(run, record=spans, sink=sink)
            check_preserved(run.rowset, state, node_id, "fail")
        except DeadlineExceeded as err:
            run.rowset.rollback_to(depth)
            if reserve_ms is None or err.set_by != f"region {node_id}":
                raise
            record["fail_elapsed_ms"] = (_clock.now() - now) * 1000.0
            raise PlanTimeout(
                f"timeout_wrapper {node_id}'s fallback did not end within the region's "
                f"{state.timeout_ms:g} ms (its reserve: {reserve_ms:g} ms)",
                node_id=node_id,
                timeout_ms=state.timeout_ms,
                trace=run.trace,
                deadline=own,
            ) from err
        except BaseException:
            # Cut by an enclosing region (or failed): its writes never leak.
            run.rowset.rollback_to(depth)
            raise
        run.rowset.commit()
        record["fail_elapsed_ms"] = (_clock.now() - now) * 1000.0

    return Group(
        key,
        reserve=0.0 if reserve_ms is None else reserve_ms / 1000.0,
        timeout=lambda run: run.wrappers[node_id].timeout_ms / 1000.0,
        parent=parent,
        on_timeout=fallback,
        deps=deps,
        on_enter=enter,
        on_success=success,
    )


def check_preserved(rs: RowSet, state: RegionState, node_id: str, branch: str) -> None:
    """The run-time half of the ``preserve`` contract: the branch left the row count, the
    selection and the order alone (validation checks the other half before the run)."""
    if rs.index is not state.index or rs.active_count != state.nrows:
        raise ValidationError(
            "preserve",
            f"the {branch} branch changed the rowset ({state.nrows} -> {rs.active_count} rows)",
            node_id=node_id,
        )


def _clamp(lo: float, x: float, hi: float) -> float:
    return max(lo, min(x, hi))


def region_budget(
    budget: Mapping[str, Any],
    override: Mapping[str, Any] | None,
    n: int,
    params: Mapping[str, tuple[Any, str]],
    env: str,
    node: Mapping[str, Any],
    node_id: str,
) -> tuple[float, bool, str | None]:
    """(timeout_ms, override_applied, override_origin) per D5.1 (real arithmetic)."""
    model_ms = _clamp(
        budget["min_ms"], budget["base_ms"] + budget["per_row_us"] * n / 1000.0, budget["max_ms"]
    )
    if override is None:
        return float(model_ms), False, None
    pid = override["param_id"].removeprefix("param.")
    resolved = params.get(pid)
    if resolved is None or resolved[0] is None:
        return float(model_ms), False, None  # no value: the override is not applied
    value, origin = resolved
    allowed = set(override["allow_sources"])
    if env == "prod":
        allowed.discard("request")  # D5.6: never loosened from a request in prod
    if origin not in allowed:
        raise ValidationError(
            "override_origin",
            f"override param {pid!r} has origin {origin!r}, allowed: {sorted(allowed)}"
            + (" (env=prod never allows request)" if env == "prod" and origin == "request" else ""),
            node_id=node_id,
            source_span=node.get("source_span"),
            details={"origin": origin, "allowed": sorted(allowed)},
        )
    override_ms = _clamp(override["min_ms"], float(value), override["max_ms"])
    timeout_ms = override_ms if override["combine"] == "replace" else min(model_ms, override_ms)
    return float(timeout_ms), True, origin
