"""``pl.compile``: lower a plan to an artifact (branches lifted into content-addressed fragments),
then validate it exactly as the engine will."""

from __future__ import annotations

from typing import Any

from ._artifact import CAPABILITY, FRAGMENT_SCHEMA, PLAN_SCHEMA, Artifact, check_schema, digest_of
from ._errors import ValidationError
from ._plan import Chain, Plan, _Foreign
from ._validate import validate

__all__ = ["compile"]


def compile(plan: Plan) -> Artifact:
    """Compile ``plan`` into a deterministic :class:`Artifact` (same plan, same bytes)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"pl.compile takes a pl.Plan, got {type(plan).__name__}")
    fragments: dict[str, dict[str, Any]] = {}
    uses_wrapper = [False]
    nodes = _lower(plan, fragments, uses_wrapper)
    caps = [CAPABILITY] if uses_wrapper[0] else []
    doc: dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "name": plan.name,
        "params": dict(sorted(plan.params.items())),
        "capabilities_required": sorted(set(caps)),
        "extensions": {cap: {"version": 1} for cap in caps},
        "nodes": nodes,
        "source_span": plan.span,
    }
    artifact = Artifact(doc, fragments)
    check_schema({**artifact.plan, "fragments": artifact.fragments})
    validate(artifact, plan.catalog)
    return artifact


def _lower(
    chain: Chain, fragments: dict[str, dict[str, Any]], uses_wrapper: list[bool]
) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    nodes: list[dict[str, Any]] = []
    for op in chain.ops:
        # Node ids come from the definition (op and name), not from positions or counters
        # shared across the plan: adding a node elsewhere does not rename this one.
        base = op.kind
        if op.kind == "task":
            base = f"task:{op.params['name']}"
        elif op.kind == "vm":
            base = f"vm:{op.params['key']}"
        counts[base] = counts.get(base, 0) + 1
        node_id = base if counts[base] == 1 else f"{base}#{counts[base]}"
        params = dict(op.params)
        if op.kind == "timeout_wrapper":
            uses_wrapper[0] = True
            for which in ("success", "fail"):
                branch = op.branches[which]
                if isinstance(branch, _Foreign):
                    raise ValidationError(
                        "closure",
                        f"if_{which} must build on the chain it is given and return it; it "
                        f"returned {type(branch.returned).__name__} (a branch may not extend "
                        "an outer chain)",
                        node_id=node_id,
                        source_span=op.span,
                    )
                fragment = {
                    "schema": FRAGMENT_SCHEMA,
                    "nodes": _lower(branch, fragments, uses_wrapper),
                }
                digest = digest_of(fragment)
                fragments[digest] = fragment
                params[which] = {"fragment_digest": digest, "args": {}}
            override = params.get("override")
            if isinstance(override, dict) and "param" in override:
                override = dict(override)
                override["param_id"] = f"param.{override.pop('param')}"
                override.setdefault("combine", "min")
                params["override"] = override
        nodes.append({"node_id": node_id, "op": op.kind, "params": params, "source_span": op.span})
    return nodes
