"""The worst-case time check of a pipeline plan's regions (D14.5).

A ``timeout_wrapper`` region's deadline lies between its budget's ``min_ms`` and ``max_ms``
(D5.1; an override with ``combine: replace`` widens that to its own clamp, one with ``min`` can
only lower it). A region's fallback is triggered by its own deadline only (D5.3), so a region
whose deadline never comes before the bound around it — the caller's budget, or an enclosing
region's — never runs its ``on_timeout`` (TB-T020); one whose ``max_ms`` reaches that bound
loses it for large inputs, from the row count the engine's own budget function says (TB-T021).
With the catalog, a task's own ``timeout`` at or above its region's ``max_ms`` never fires
(TB-T022). The plan is read by the pipeline's own loader (``Artifact.from_json``, which checks
the schema and every fragment's digest) or compiled from a ``pl.Plan``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._json import json_path
from ..pipeline import Artifact, Catalog, Plan
from ..pipeline import compile as compile_plan
from ..pipeline._region import region_budget as region_budget_ms
from ._findings import Finding, Location, Report, shown

__all__ = ["check_pipeline"]

_MAX_ROWS = 2**62


def _float(x: Any) -> float:
    """A JSON number as a float; an integer past what a float holds is infinite."""
    try:
        return float(x)
    except OverflowError:
        return math.inf


def _range_ms(params: Mapping[str, Any]) -> tuple[float, float, list[str | int]]:
    """The least and the most a region's deadline can be, in ms, and where the most is set."""
    budget = params["budget"]
    lo, hi = _float(budget["min_ms"]), _float(budget["max_ms"])
    hi_at: list[str | int] = ["params", "budget", "max_ms"]
    override = params.get("override")
    # An override without its clamp is refused by validation (override_clamp): not counted.
    if override is not None and "min_ms" in override and "max_ms" in override:
        lo = min(lo, _float(override["min_ms"]))
        if override["combine"] == "replace" and _float(override["max_ms"]) > hi:
            hi, hi_at = _float(override["max_ms"]), ["params", "override", "max_ms"]
    return lo, hi, hi_at


def _rows_reaching(node: Mapping[str, Any], bound_ms: float) -> int | None:
    """The fewest rows for which the region's budget (the engine's function, D5.1) reaches
    ``bound_ms``, or ``None`` when no row count does."""

    def model(n: int) -> float:
        return region_budget_ms(node["params"]["budget"], None, n, {}, "dev", node, "")[0]

    try:
        if model(_MAX_ROWS) < bound_ms:
            return None
    except OverflowError:
        return None
    lo, hi = 0, _MAX_ROWS
    while lo < hi:  # the budget grows with the rows: the first n that reaches the bound
        mid = (lo + hi) // 2
        if model(mid) >= bound_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Walk:
    def __init__(
        self, artifact: Artifact, catalog: Catalog | None, budget: float | None, file: str
    ):
        self.artifact = artifact
        self.catalog = catalog
        self.budget = budget
        self.file = file
        self.findings: list[Finding] = []

    def at(self, parts: list[str | int]) -> Location:
        return Location(file=self.file, path=json_path(parts))

    def nodes(
        self,
        nodes: list[Mapping[str, Any]],
        base: list[str | int],
        around: float | None,
        around_name: str,
        region: tuple[str, float, list[str | int]] | None,
    ) -> None:
        """Check ``nodes`` (at ``base``) under the bound ``around`` (ms; ``None``: none)."""
        for i, node in enumerate(nodes):
            path = [*base, i]
            if node["op"] == "timeout_wrapper":
                self.wrapper(node, path, around, around_name)
            elif node["op"] == "task" and region is not None and self.catalog is not None:
                self.task(node, path, region)

    def wrapper(
        self, node: Mapping[str, Any], path: list[str | int], around: float | None, around_name: str
    ) -> None:
        params = node["params"]
        node_id = node["node_id"]
        lo, hi, hi_at = _range_ms(params)
        subject = f"region {node_id}"
        self.findings.append(
            Finding(
                "TB-T030",
                subject,
                f"the region's deadline lies between {shown(lo / 1000)} and {shown(hi / 1000)} "
                f"after it starts (on_timeout: {params.get('on_timeout', 'fail_plan')})",
                self.at(path),
                numbers={"min": lo / 1000, "max": hi / 1000},
            )
        )
        if around is not None:
            if lo >= around:
                self.findings.append(
                    Finding(
                        "TB-T020",
                        subject,
                        f"the region's deadline never comes before {around_name} "
                        f"({shown(around / 1000)}): its least budget is {shown(lo / 1000)}, so "
                        f"its on_timeout ({params.get('on_timeout', 'fail_plan')}) never "
                        "applies (D5.3)",
                        self.at([*path, "params", "budget", "min_ms"]),
                        f"lower min_ms (and max_ms) below {around:g}",
                        {"min": lo / 1000, "budget": around / 1000},
                    )
                )
            elif hi >= around:
                rows = _rows_reaching(node, around) if hi_at[1] == "budget" else None
                when = "" if rows is None else f" from {rows:,} rows on"
                self.findings.append(
                    Finding(
                        "TB-T021",
                        subject,
                        f"max_ms ({shown(hi / 1000)}) is at or above {around_name} "
                        f"({shown(around / 1000)}): {when.strip() or 'for large inputs'}, "
                        f"{around_name} ends the work first and the region's on_timeout does "
                        "not apply (D5.3)",
                        self.at([*path, *hi_at]),
                        f"lower max_ms below {around:g}",
                        {"max": hi / 1000, "budget": around / 1000, "rows": rows},
                        frozenset({"rows"}),
                    )
                )
        reserve = params.get("reserve_ms")
        if reserve:
            self.reserve(node, path, float(reserve), hi, hi_at, around, around_name)
        inner = hi if around is None else min(hi, around)
        for branch in ("success", "fail"):
            digest = params[branch]["fragment_digest"]
            fragment = self.artifact.fragments.get(digest)
            if fragment is None:
                continue
            # The success branch runs under this region; the fallback starts fresh under what
            # is around the region (D5.2).
            if branch == "success":
                self.nodes(
                    fragment["nodes"],
                    ["fragments", digest, "nodes"],
                    inner,
                    f"the deadline of region {node_id}",
                    (node_id, hi, [*path, *hi_at]),
                )
            else:
                self.nodes(
                    fragment["nodes"], ["fragments", digest, "nodes"], around, around_name, None
                )

    def reserve(
        self,
        node: Mapping[str, Any],
        path: list[str | int],
        reserve: float,
        hi: float,
        hi_at: list[str | int],
        around: float | None,
        around_name: str,
    ) -> None:
        """TB-T033: a reserve at or above the most the region's deadline (or the bound around
        it) can leave refuses the success branch at every entry (D1.20, D5.9)."""
        if around is not None and around <= hi:
            limit, limit_name = around, around_name
        else:
            limit, limit_name = hi, f"the region's longest budget ({'.'.join(map(str, hi_at[1:]))})"
        if reserve < limit:
            return
        self.findings.append(
            Finding(
                "TB-T033",
                f"region {node['node_id']}",
                f"the reserve of {shown(reserve / 1000)} is at least {limit_name} "
                f"({shown(limit / 1000)}): the success branch is refused at every entry and "
                f"the region always goes straight to its on_timeout "
                f"({node['params'].get('on_timeout', 'fail_plan')}) (D1.20, D5.9)",
                self.at([*path, "params", "reserve_ms"]),
                f"lower reserve_ms below {limit:g}, or raise {limit_name}",
                {"reserve": reserve / 1000, "budget": limit / 1000},
            )
        )

    def task(
        self,
        node: Mapping[str, Any],
        path: list[str | int],
        region: tuple[str, float, list[str | int]],
    ) -> None:
        assert self.catalog is not None
        spec = self.catalog.tasks.get(node["params"]["name"])
        if spec is None or spec.timeout is None:
            return
        region_id, hi, _ = region
        timeout_ms = spec.timeout * 1000
        if timeout_ms >= hi:
            self.findings.append(
                Finding(
                    "TB-T022",
                    f"task {spec.name}",
                    f"the task's own timeout ({shown(spec.timeout)}) never fires: region "
                    f"{region_id}'s deadline ({shown(hi / 1000)} at most) always ends it first "
                    "(D5.5)",
                    Location(file=self.file, path=json_path(path), parameter="timeout"),
                    f"lower the task's timeout below {shown(hi / 1000)}, or drop it",
                    {"timeout": spec.timeout, "max": hi / 1000},
                )
            )


def check_pipeline(
    plan: Artifact | Plan | bytes | str,
    *,
    budget: float | None = None,
    catalog: Catalog | None = None,
    file: str = "<plan>",
) -> Report:
    """The findings of a pipeline plan: a compiled :class:`Artifact`, its JSON, or a ``Plan``
    (compiled here; its catalog is used). ``budget``: the caller's budget in seconds.

    Raises :class:`~timebound.pipeline.ValidationError` for a plan the pipeline refuses.
    """
    if isinstance(plan, Plan):
        catalog = catalog or plan.catalog
        artifact = compile_plan(plan)
    elif isinstance(plan, Artifact):
        artifact = plan
    else:
        artifact = Artifact.from_json(plan)
    walk = _Walk(artifact, catalog, budget, file)
    around = None if budget is None else budget * 1000
    walk.nodes(artifact.plan["nodes"], ["nodes"], around, "the caller's budget", None)
    return Report.of("pipeline", file, walk.findings, budget)
