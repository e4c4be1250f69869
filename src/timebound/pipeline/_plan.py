"""Authoring: ``pl.Plan(...)`` and its fluent chain of ops."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core._durations import Duration
from .._core._errors import ConfigurationError
from .._core._renamed import renamed
from .._core._scopes import reserve_seconds
from ._expr import Expr
from ._model import REGISTRY_KEYWORD, Catalog, P, _json_scalar, deprecated_registry

__all__ = ["Chain", "Plan"]


def _span(depth: int = 2) -> dict[str, Any]:
    """File and line of the authoring call (the caller of the chain method)."""
    frame = sys._getframe(depth)
    # Skip frames of this package (e.g. Plan.__init__ calling Chain.__init__).
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    filename = frame.f_code.co_filename
    try:
        rel = os.path.relpath(filename)
        if not rel.startswith(".."):
            filename = rel
    except ValueError:  # another drive (Windows)
        pass
    return {"file": filename.replace(os.sep, "/"), "line": frame.f_lineno}


@dataclass
class Op:
    """One authored op: ``kind``, JSON-ready ``params``, the call's ``span``, and for a
    ``timeout_wrapper`` its two branch chains."""

    kind: str
    params: dict[str, Any]
    span: dict[str, Any]
    branches: dict[str, Chain] = field(default_factory=dict)


class Chain:
    """A sequence of ops; every method appends one and returns the chain."""

    def __init__(self, catalog: Catalog) -> None:
        if not isinstance(catalog, Catalog):
            raise ConfigurationError(f"catalog must be a pl.Catalog, got {catalog!r}")
        self.catalog = catalog
        self.ops: list[Op] = []

    @property
    def registry(self) -> Catalog:
        """Deprecated: :attr:`catalog`."""
        return deprecated_registry(self.catalog, type(self).__name__)

    def _add(self, kind: str, params: dict[str, Any], **branches: Chain) -> Chain:
        self.ops.append(Op(kind, params, _span(3), dict(branches)))
        return self

    def task(self, name: str, **args: Any) -> Chain:
        """Run the registered task ``name``; constant ``args`` have origin ``fragment``, an
        argument written ``pl.P("param")`` takes the param's value at run time."""
        if not isinstance(name, str):
            raise ConfigurationError(f"task name must be a string, got {name!r}")
        encoded: dict[str, Any] = {}
        for arg, value in sorted(args.items()):
            if isinstance(value, P):
                encoded[arg] = {"param": value.param}
            else:
                _json_scalar(value, f"task {name!r} argument {arg!r}")
                encoded[arg] = {"const": value}
        return self._add("task", {"name": name, "args": encoded})

    def vm(self, key: str, expr: Expr) -> Chain:
        """Compute ``key`` from an expression over keys (``pl.col``)."""
        if not isinstance(expr, Expr):
            raise ConfigurationError(f"vm({key!r}, ...) takes an expression built with pl.col")
        return self._add("vm", {"key": key, "expr": expr.to_json()})

    def filter(self, expr: Expr) -> Chain:
        """Keep the active rows where ``expr`` is true."""
        if not isinstance(expr, Expr):
            raise ConfigurationError("filter() takes an expression built with pl.col")
        return self._add("filter", {"expr": expr.to_json()})

    def sort(self, key: str, descending: bool = False) -> Chain:
        """Order the active rows by ``key`` (stable, nulls last)."""
        return self._add("sort", {"key": key, "descending": bool(descending)})

    def take(self, n: int) -> Chain:
        """Keep the first ``n`` active rows."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigurationError(f"take() needs a count >= 0, got {n!r}")
        return self._add("take", {"n": n})

    def dedupe(self, key: str) -> Chain:
        """Keep the first active row of each value of ``key``."""
        return self._add("dedupe", {"key": key})

    def fill_defaults(self, keys: Iterable[str]) -> Chain:
        """Overwrite ``keys``: null when nullable, else the catalog's default."""
        if isinstance(keys, str):
            keys = [keys]
        return self._add("fill_defaults", {"keys": sorted(set(keys))})

    def timeout_wrapper(
        self,
        *,
        if_success: Callable[[Chain], Chain],
        if_fail: Callable[[Chain], Chain],
        budget: Mapping[str, Any],
        override: Mapping[str, Any] | None = None,
        on_timeout: str = "fail_plan",
        reserve: Duration | None = None,
    ) -> Chain:
        """Run ``if_success`` under a region deadline; on its timeout roll back and either fail
        the plan or run ``if_fail`` from the original rows (RFC 0002).

        ``reserve`` (a duration, D5.9) is kept for the region's answer: the success branch sees
        the region's deadline less it, and the rollback and ``if_fail`` run in it, bounded by
        the region's own deadline. Stored as ``reserve_ms``."""
        branches: dict[str, Chain] = {}
        for which, build in (("success", if_success), ("fail", if_fail)):
            if not callable(build):
                raise ConfigurationError(f"if_{which} must be a function of a chain")
            branch = Chain(self.catalog)
            returned = build(branch)
            if returned is not branch:
                branch = _Foreign(self.catalog, returned)
            branches[which] = branch
        params: dict[str, Any] = {
            "budget": dict(budget) if isinstance(budget, Mapping) else budget,
            "on_timeout": on_timeout,
            "rowset_contract": "preserve",
        }
        if override is not None:
            params["override"] = dict(override) if isinstance(override, Mapping) else override
        seconds = reserve_seconds(reserve)
        if seconds:
            params["reserve_ms"] = round(seconds * 1000.0, 6)
        return self._add("timeout_wrapper", params, **branches)


class _Foreign(Chain):
    """A branch function that returned something other than the chain it was given (an outer
    chain, say): the compiler reports it as a ``closure`` violation."""

    def __init__(self, catalog: Catalog, returned: object) -> None:
        super().__init__(catalog)
        self.returned = returned


class Plan(Chain):
    """A named plan over a catalog; ``params`` are link-time constants of origin ``plan``."""

    @renamed(registry=REGISTRY_KEYWORD)
    def __init__(
        self, name: str, *, catalog: Catalog, params: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(catalog)
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a plan needs a name, got {name!r}")
        self.name = name
        self.params: dict[str, Any] = {}
        for pid, value in (params or {}).items():
            _json_scalar(value, f"plan param {pid!r}")
            self.params[pid] = value
        self.span = _span(2)
