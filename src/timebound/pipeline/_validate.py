"""Validation of an artifact against a catalog, fail-closed (what is not known to be safe is
refused).

One implementation, run by ``pl.compile`` and again by the engine against the tasks it will
actually run. Facts recorded in the artifact are never trusted: writes, rowset effects and
types come from the registry.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .._core._errors import ConfigurationError
from . import _expr
from ._artifact import CAPABILITY, Artifact
from ._errors import ValidationError
from ._model import ORIGINS, Catalog, Writes, check_value, evaluate

__all__ = ["Checked", "check_params", "validate"]

SUPPORTED_CAPABILITIES = frozenset({CAPABILITY})
_MUTATING = ("filter", "sort", "take", "dedupe")


@dataclass
class Checked:
    """What validation learned: the keys the plan expects in its input rows (with the first
    node that reads each, and whether that node is inside a wrapper branch)."""

    inputs: dict[str, tuple[str, bool]] = field(default_factory=dict)


def task_known(
    node: Mapping[str, Any], plan_params: Mapping[str, Any], registry: Catalog
) -> dict[str, Any]:
    """The param values a task node knows at link time: its constant arguments that bind a
    param, its ``P`` arguments that read a plan param, and the plan's params."""
    known = dict(plan_params)
    for arg, spec in node["params"]["args"].items():
        if arg not in registry.params:
            continue
        if "const" in spec:
            known[arg] = spec["const"]
        elif spec["param"] in plan_params:
            known[arg] = plan_params[spec["param"]]
        else:
            known.pop(arg, None)  # bound at run time: unknown now
    return known


def check_params(registry: Catalog, given: Mapping[Any, Any], origin: str) -> None:
    """Raise :class:`ValidationError` unless every param in ``given`` is registered and has a
    value of its type; ``origin`` (``plan``, ``request``, ``source``) names them in the error."""
    for pid, value in given.items():
        pdef = registry.params.get(pid) if isinstance(pid, str) else None
        if pdef is None:
            raise ValidationError("reference", f"{origin} param {pid!r} is not registered")
        try:
            check_value(value, pdef.type, f"{origin} param {pid!r}")
        except ConfigurationError as exc:
            raise ValidationError("type", str(exc)) from None


def validate(
    artifact: Artifact,
    registry: Catalog,
    *,
    capabilities: Collection[str] | None = None,
) -> Checked:
    """Raise :class:`ValidationError` for the first broken rule; ``capabilities`` are the
    engine's (``None``: compile time, only the artifact's own declaration is checked)."""
    plan = artifact.plan
    required = set(plan["capabilities_required"])
    uses_wrapper = any(node["op"] == "timeout_wrapper" for node in plan["nodes"])
    if uses_wrapper and CAPABILITY not in required:
        raise ValidationError(
            "capability",
            f"the plan uses timeout_wrapper but does not list capability {CAPABILITY}",
            details={"missing": [CAPABILITY]},
        )
    for cap in sorted(required):
        if cap not in SUPPORTED_CAPABILITIES:
            raise ValidationError(
                "capability",
                f"capability {cap} is not known to this engine",
                details={"missing": [cap]},
            )
        if capabilities is not None and cap not in capabilities:
            raise ValidationError(
                "capability",
                f"the plan requires capability {cap}, which this engine does not enable",
                details={"missing": [cap]},
            )
    params = plan["params"]
    check_params(registry, params, "plan")
    v = _Validator(artifact, registry, params)
    v.written_anywhere = v.all_writes(plan["nodes"])
    v.chain(plan["nodes"], set(), branch=None, path="")
    return v.checked


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _assignable(value: pa.DataType, key: pa.DataType) -> bool:
    """A vm result may be stored in a key of the same type, or a number in a number key (the
    cast is checked per value at run time); anything else (a number into a string) is a type
    error, not a silent conversion."""
    return bool(value == key or pa.types.is_null(value) or (_numeric(value) and _numeric(key)))


class _Validator:
    def __init__(self, artifact: Artifact, registry: Catalog, params: Mapping[str, Any]) -> None:
        self.fragments = artifact.fragments
        self.registry = registry
        self.params = params
        self.checked = Checked()
        self.written_anywhere: set[str] = set()
        self.depth = 0

    def fragment(self, node: Mapping[str, Any], which: str, path: str) -> list[dict[str, Any]]:
        digest = node["params"][which]["fragment_digest"]
        fragment = self.fragments.get(digest)
        if fragment is None:
            raise ValidationError(
                "reference",
                f"{which} branch fragment {digest} is not in the artifact",
                node_id=path + node["node_id"],
                source_span=node["source_span"],
            )
        nodes: list[dict[str, Any]] = fragment["nodes"]
        return nodes

    def all_writes(self, nodes: list[dict[str, Any]]) -> set[str]:
        """Every key any node may write (upper bounds), branches included."""
        out: set[str] = set()
        self.depth += 1
        if self.depth > 64:
            raise ValidationError("schema", "timeout_wrappers are nested more than 64 deep")
        for node in nodes:
            op, p = node["op"], node["params"]
            if op == "task":
                task = self.registry.tasks.get(p["name"])
                if task is not None:
                    w = evaluate(task.writes, task_known(node, self.params, self.registry))
                    out |= w.keys or set()
            elif op == "vm":
                out.add(p["key"])
            elif op == "fill_defaults":
                out |= set(p["keys"])
            elif op == "timeout_wrapper":
                for which in ("success", "fail"):
                    out |= self.all_writes(self.fragment(node, which, ""))
        self.depth -= 1
        return out

    def error(
        self, rule: str, node: Mapping[str, Any], path: str, message: str, **details: Any
    ) -> ValidationError:
        return ValidationError(
            rule,
            message,
            node_id=path + node["node_id"],
            source_span=node.get("source_span"),
            details=details or None,
        )

    def read(
        self, key: str, node: Mapping[str, Any], available: set[str], branch: str | None, path: str
    ) -> None:
        if key not in self.registry.keys:
            raise self.error("reference", node, path, f"reads unknown key {key!r}")
        if key in available:
            return
        if branch is not None and key in self.written_anywhere:
            raise self.error(
                "closure",
                node,
                path,
                f"the {branch} branch reads key {key!r}, which is not available at the "
                "wrapper's input (it is written only outside or after the wrapper)",
                key=key,
            )
        # Not written before this point: it must come with the input rows.
        self.checked.inputs.setdefault(key, (path + node["node_id"], branch is not None))
        available.add(key)

    def chain(
        self, nodes: list[dict[str, Any]], available: set[str], branch: str | None, path: str
    ) -> set[str]:
        """Validate a chain; returns the keys it writes exactly (meaningful inside a branch)."""
        exact: set[str] = set()
        for node in nodes:
            op, p = node["op"], node["params"]
            if branch is not None and op in _MUTATING:
                raise self.error(
                    "preserve",
                    node,
                    path,
                    f"{op} changes the rowset; a timeout_wrapper branch must preserve it (v1)",
                )
            if op == "task":
                exact |= self.task(node, available, branch, path)
            elif op == "vm":
                key = p["key"]
                kdef = self.registry.keys.get(key)
                if kdef is None:
                    raise self.error("reference", node, path, f"writes unknown key {key!r}")
                rtype = self.expr(p["expr"], node, available, branch, path)
                if not _assignable(rtype, kdef.type):
                    raise self.error(
                        "type",
                        node,
                        path,
                        f"the expression gives {rtype}, key {key!r} holds {kdef.type}",
                    )
                available.add(key)
                exact.add(key)
            elif op == "filter":
                rtype = self.expr(p["expr"], node, available, branch, path)
                if rtype != pa.bool_():
                    raise self.error(
                        "type", node, path, f"a filter needs a boolean expression, got {rtype}"
                    )
            elif op in ("sort", "dedupe"):
                self.read(p["key"], node, available, branch, path)
            elif op == "fill_defaults":
                for key in p["keys"]:
                    kdef = self.registry.keys.get(key)
                    if kdef is None:
                        raise self.error("reference", node, path, f"fills unknown key {key!r}")
                    if not kdef.nullable and not kdef.has_default:
                        raise self.error(
                            "fill_defaults",
                            node,
                            path,
                            f"key {key!r} is not nullable and has no registry default",
                            key=key,
                        )
                    available.add(key)
                    exact.add(key)
            elif op == "timeout_wrapper":
                exact |= self.wrapper(node, available, path)
        return exact

    def expr(
        self, e: Any, node: Mapping[str, Any], available: set[str], branch: str | None, path: str
    ) -> pa.DataType:
        try:
            _expr.check(e)
        except ValueError as exc:
            raise self.error("schema", node, path, str(exc)) from None
        for key in sorted(_expr.columns(e)):
            self.read(key, node, available, branch, path)
        empty = {k: pa.array([], type=self.registry.keys[k].type) for k in _expr.columns(e)}
        try:
            result = _expr.evaluate(e, empty.__getitem__, 0)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise self.error(
                "type", node, path, f"the expression does not type-check: {exc}"
            ) from None
        rtype: pa.DataType = result.type
        return rtype

    def task(
        self, node: Mapping[str, Any], available: set[str], branch: str | None, path: str
    ) -> set[str]:
        p = node["params"]
        task = self.registry.tasks.get(p["name"])
        if task is None:
            raise self.error("reference", node, path, f"task {p['name']!r} is not registered")
        for arg, spec in p["args"].items():
            if "param" in spec and spec["param"] not in self.registry.params:
                raise self.error(
                    "reference",
                    node,
                    path,
                    f"argument {arg!r} reads unknown param {spec['param']!r}",
                )
            pdef = self.registry.params.get(arg)
            if pdef is not None and "const" in spec:
                try:
                    check_value(spec["const"], pdef.type, f"argument {arg!r}")
                except ConfigurationError as exc:
                    raise self.error("type", node, path, str(exc)) from None
        if branch is not None and task.rowset != "preserve":
            raise self.error(
                "preserve",
                node,
                path,
                f"task {task.name!r} declares rowset={task.rowset!r}; a timeout_wrapper branch "
                "admits only rowset-preserving tasks",
            )
        for key in task.reads:
            self.read(key, node, available, branch, path)
        writes: Writes = evaluate(task.writes, task_known(node, self.params, self.registry))
        if branch is not None and writes.kind != "exact":
            raise self.error(
                "writes_exact",
                node,
                path,
                f"task {task.name!r} writes keys that are known only at run time ({writes.kind}); "
                "inside a timeout_wrapper every write must be exact at link time -- bind the "
                "param it depends on to a constant",
                kind=writes.kind,
            )
        available |= writes.keys or set()
        return set(writes.keys or ())

    def wrapper(self, node: Mapping[str, Any], available: set[str], path: str) -> set[str]:
        p = node["params"]
        b = p["budget"]
        for name in ("base_ms", "per_row_us", "min_ms", "max_ms"):
            if not math.isfinite(b[name]):
                raise self.error("schema", node, path, f"budget {name} must be finite")
        if b["min_ms"] > b["max_ms"]:
            raise self.error("schema", node, path, "budget min_ms is larger than max_ms")
        override = p.get("override")
        reserve = p.get("reserve_ms")
        if reserve is not None:
            if not math.isfinite(reserve):
                raise self.error("schema", node, path, "reserve_ms must be finite")
            most, where = float(b["max_ms"]), "budget max_ms"
            if (
                override is not None
                and override.get("combine") == "replace"
                and override.get("max_ms", 0) > most
            ):
                most, where = float(override["max_ms"]), "override max_ms"
            if reserve >= most:
                # D5.9: the success branch would never run (D1.20 at every entry).
                raise self.error(
                    "reserve",
                    node,
                    path,
                    f"reserve_ms ({reserve:g}) is not shorter than the longest budget the region "
                    f"can get ({where} {most:g}): its success branch would never run",
                    reserve_ms=reserve,
                    max_ms=most,
                )
        if override is not None:
            if "min_ms" not in override or "max_ms" not in override:
                raise self.error(
                    "override_clamp",
                    node,
                    path,
                    "an override must be clamped: give both min_ms and max_ms",
                )
            if override["min_ms"] > override["max_ms"]:
                raise self.error(
                    "override_clamp", node, path, "override min_ms is larger than max_ms"
                )
            pid = override["param_id"].removeprefix("param.")
            pdef = self.registry.params.get(pid)
            if pdef is None:
                raise self.error(
                    "reference", node, path, f"override param {pid!r} is not registered"
                )
            if not (pa.types.is_integer(pdef.type) or pa.types.is_floating(pdef.type)):
                raise self.error(
                    "type",
                    node,
                    path,
                    f"override param {pid!r} must be a number of milliseconds, it is {pdef.type}",
                )
            unknown = set(override["allow_sources"]) - set(ORIGINS)
            if unknown:
                raise self.error("schema", node, path, f"unknown origins {sorted(unknown)}")
            if pid in self.params and "plan" not in override["allow_sources"]:
                raise self.error(
                    "override_origin",
                    node,
                    path,
                    f"override param {pid!r} comes from the plan, which allow_sources omits",
                    origin="plan",
                )
        inner = path + node["node_id"] + "/"
        written: dict[str, set[str]] = {}
        for which in ("success", "fail"):
            nodes = self.fragment(node, which, path)
            written[which] = self.chain(
                nodes, set(available), branch=which, path=inner + which + "/"
            )
        if written["success"] != written["fail"]:
            s, f = written["success"], written["fail"]
            raise self.error(
                "shape_equality",
                node,
                path,
                "the success and fail branches must write the same keys "
                f"(only success: {sorted(s - f)}, only fail: {sorted(f - s)})",
                success={"missing": sorted(f - s), "extra": sorted(s - f)},
                fail={"missing": sorted(s - f), "extra": sorted(f - s)},
            )
        available |= written["success"]
        return written["success"]
