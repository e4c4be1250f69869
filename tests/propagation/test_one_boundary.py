"""Every client adapter obtains its attempts from ``_client.begin`` and repeats none of the cut
logic (one client-attempt abstraction and one exception-mapping boundary)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

#: Every module that sends something on the caller's behalf: HTTP, gRPC and the databases.
ADAPTERS = (
    "http._httpx",
    "http._requests",
    "http._aiohttp",
    "grpc._interceptors",
    "db._asyncpg",
    "db._psycopg",
    "db._redis",
)

#: What only ``_client`` may use: clamping, the fail-fast check, the cut's error and the
#: request's mark. An adapter using one of them is cutting (or reporting a cut) by itself.
CUT_PRIMITIVES = frozenset(
    {
        "clamp_timeout",
        "current_bound_error",
        "current_bound_source",
        "current_deadline",
        "mark_spent",
        "mark_cancelled_by_deadline",
        "remaining",
    }
)


def _tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(f"timebound.propagation.{module}")
    assert spec is not None and spec.origin is not None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"))


def _imported(tree: ast.Module) -> dict[str, str]:
    """Every name imported ``from X import name``, mapped to its module ``X`` (dots kept)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = "." * node.level + (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = source
    return names


def _calls(tree: ast.Module, name: str) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    )


@pytest.mark.parametrize("module", ADAPTERS)
def test_adapter_obtains_its_attempts_from_client_begin(module: str) -> None:
    """The adapter imports ``begin`` from ``_client`` and calls it."""
    tree = _tree(module)
    assert _imported(tree).get("begin") == ".._client"
    assert _calls(tree, "begin") >= 1


@pytest.mark.parametrize("module", (*ADAPTERS, "db._common"))
def test_adapter_uses_none_of_the_cut_primitives(module: str) -> None:
    """No adapter (nor the databases' shared helpers) clamps, checks for a spent deadline or
    marks the request by itself: ``_client`` does."""
    tree = _tree(module)
    used = CUT_PRIMITIVES & (
        set(_imported(tree))
        | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        | {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    )
    assert used == set()


@pytest.mark.parametrize("module", ("db._asyncpg", "db._psycopg", "db._redis", "db._common"))
def test_database_adapters_count_through_the_attempts_report(module: str) -> None:
    """The database adapters never touch the counters: the attempt's report counts (D4.7)."""
    imported = _imported(_tree(module))
    assert "counters" not in imported
    assert "emit" not in imported
