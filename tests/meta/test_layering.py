"""Dependencies between timebound's packages point down only (docs/design/README.md).

The rules apply to every package by its place in ``TIERS``, not to a list of files, so packages
added later are covered as soon as they exist: a package missing from ``TIERS`` fails the test.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "timebound"

# Lowest first. A package may import packages of lower tiers only: not its siblings in the same
# tier (siblings share code by moving it down), never a higher tier.
TIERS: list[set[str]] = [
    {"_core"},
    {"telemetry", "testing", "_json"},
    {"policies", "admission"},
    {"_engine", "_store", "propagation", "lowlevel"},
    {"dsl", "pipeline", "deferred"},
    {"workflow"},
    {"host", "analysis"},
    {"cli"},
]
RANK = {package: rank for rank, tier in enumerate(TIERS) for package in tier}
# Only these may import the root package (it loads the whole public API).
ROOT_IMPORTERS = {"host", "cli"}
# Leaf modules of the root package that import nothing from timebound: free for every layer.
LEAF_MODULES = {"timebound._version"}
# Rooms: sub-packages of one package that share the modules beside them but not each other.
# A room imports no other room of its package, and those shared modules import no room (the
# package's public facades, which re-export a room's names, are not private and may).
ROOMS: dict[str, set[str]] = {"propagation": {"http", "grpc", "db"}}
# These use public names only: no private module, no private attribute of timebound's objects.
PUBLIC_ONLY = {"cli"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _dynamic_target(node: ast.AST) -> str | None:
    """The module named by ``sys.modules[...]``, ``sys.modules.get(...)``,
    ``importlib.import_module(...)`` or ``__import__(...)`` with a literal name."""
    if isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
        return _literal(node.slice)
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and _is_sys_modules(func.value):
            return _literal(node.args[0])
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in {"import_module", "__import__"}:
            return _literal(node.args[0])
    return None


def imported_modules(source: str, module: str) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` for every timebound module that the code of ``module``
    (its dotted name) imports, statically or through ``sys.modules``/``importlib``."""
    package_parts = module.split(".")[:-1]  # for a package's __init__, the package itself
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target, [alias.name for alias in node.names]))
        elif (target := _dynamic_target(node)) is not None:
            found.append((node.lineno, target, []))
    return [(line, t, names) for line, t, names in found if t.split(".")[0] == "timebound"]


def _room_violations(source: str, relpath: pathlib.PurePath, module: str) -> list[str]:
    """What breaks the rooms of ``relpath``'s package (see ``ROOMS``)."""
    own, rooms = relpath.parts[0], ROOMS.get(relpath.parts[0], set())
    if not rooms or len(relpath.parts) < 2:
        return []
    in_room = relpath.parts[1] if len(relpath.parts) > 2 and relpath.parts[1] in rooms else None
    shared = in_room is None and _is_private(relpath.stem)
    if in_room is None and not shared:
        return []
    problems = []
    for line, target, names in imported_modules(source, module):
        parts = target.split(".")
        if parts[:2] != ["timebound", own]:
            continue
        entered = {parts[2]} if len(parts) > 2 else set(names)
        for room in sorted((entered & rooms) - {in_room}):
            who = f"room {in_room}" if in_room else "a shared module"
            problems.append(f"{relpath}:{line}: {who} of {own} imports room {room}")
    return problems


def violations(source: str, relpath: pathlib.PurePath) -> list[str]:
    """What breaks the layering in ``source``, a file at ``relpath`` under src/timebound."""
    own = relpath.parts[0]
    module = ".".join(("timebound", *relpath.with_suffix("").parts))
    problems = []
    for line, target, names in imported_modules(source, module):
        where = f"{relpath}:{line}"
        if target == "timebound":
            # `from timebound import telemetry` names a sub-package, not the root's API.
            subpackages = [n for n in names if n in RANK]
            if subpackages:
                targets = [f"timebound.{n}" for n in subpackages]
            elif own not in ROOT_IMPORTERS:
                problems.append(f"{where}: imports the root package timebound")
                continue
            else:
                targets = []
        else:
            targets = [target]
        for full in targets:
            package = full.split(".")[1]
            below = full in LEAF_MODULES or package not in RANK or RANK[package] < RANK[own]
            if package != own and not below:
                problems.append(f"{where}: {own} imports {full} (not below it)")
            if own in PUBLIC_ONLY and package != own:
                private = [p for p in full.split(".")[1:] if _is_private(p)]
                private += [n for n in names if _is_private(n)]
                if private:
                    problems.append(f"{where}: uses private {full} {private}")
    problems += _room_violations(source, relpath, module)
    if own in PUBLIC_ONLY:
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
            ):
                problems.append(f"{relpath}:{node.lineno}: uses private attribute .{node.attr}")
    return problems


PACKAGES = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())


def test_every_package_has_a_tier() -> None:
    """Each sub-package is placed in a tier, so the rules cover it."""
    unplaced = [p for p in PACKAGES if p not in RANK]
    assert not unplaced, f"place {unplaced} in TIERS"


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_point_down(package: str) -> None:
    """No file of the package imports its own tier, a higher tier, or the root package."""
    problems = []
    for path in sorted((SRC / package).rglob("*.py")):
        rel = path.relative_to(SRC)
        problems += violations(path.read_text(encoding="utf-8"), rel)
    assert not problems, "\n".join(problems)


def _check(package_file: str, source: str) -> list[str]:
    return violations(source, pathlib.PurePath(package_file))


def test_core_reaching_into_telemetry_through_sys_modules_is_caught() -> None:
    """`_core` looking telemetry up in sys.modules counts as importing it."""
    source = "import sys\nevents = sys.modules.get('timebound.telemetry._events')\n"
    assert _check("_core/_preempt.py", source) == [
        "_core/_preempt.py:2: _core imports timebound.telemetry._events (not below it)"
    ]


def test_subscripting_sys_modules_and_import_module_are_caught() -> None:
    """`sys.modules[...]` and `importlib.import_module(...)` with a literal name count too."""
    source = (
        "import sys, importlib\n"
        "a = sys.modules['timebound.policies']\n"
        "b = importlib.import_module('timebound.dsl')\n"
    )
    assert len(_check("telemetry/_events.py", source)) == 2


def test_exporter_importing_the_root_package_is_caught() -> None:
    """An exporter reading `__version__` from the root package is a layering leak."""
    source = "def f():\n    from .. import __version__\n"
    assert _check("telemetry/otel.py", source) == [
        "telemetry/otel.py:2: imports the root package timebound"
    ]


def test_the_version_module_is_free_to_import() -> None:
    """The leaf `_version` module may be read from any layer."""
    assert _check("telemetry/otel.py", "from .._version import __version__\n") == []


def test_cli_private_module_is_caught() -> None:
    """The CLI importing a private module of another package is caught."""
    source = "from ..dsl._runtime import to_json_value\nfrom .._core import _clock\n"
    assert len(_check("cli/_dsl.py", source)) == 2


def test_cli_private_attribute_is_caught() -> None:
    """The CLI calling a private method of a public object is caught."""
    source = "def f(program):\n    return program._execute({})\n"
    assert _check("cli/_dsl.py", source) == ["cli/_dsl.py:2: uses private attribute ._execute"]


def test_cli_reading_the_private_version_module_is_caught() -> None:
    """The CLI takes the version from the root package, not from the private module."""
    assert _check("cli/__init__.py", "from .._version import __version__\n") == [
        "cli/__init__.py:1: uses private timebound._version ['_version']"
    ]


def test_cli_own_private_modules_are_fine() -> None:
    """The CLI's table naming its own private command modules is not a leak."""
    source = "import importlib\nm = importlib.import_module('timebound.cli._demo')\n"
    assert _check("cli/__init__.py", source) == []


def test_sibling_in_the_same_tier_is_caught() -> None:
    """A package importing a sibling of its own tier (pipeline -> dsl) is caught."""
    assert _check("pipeline/_plan.py", "from ..dsl import compile\n") == [
        "pipeline/_plan.py:1: pipeline imports timebound.dsl (not below it)"
    ]


def test_lower_tier_import_is_allowed() -> None:
    """Importing downwards (workflow -> propagation, _core) is allowed."""
    source = "from ..propagation import httpx\nfrom timebound._core._clock import now\n"
    assert _check("workflow/_engine.py", source) == []


def test_a_room_importing_another_room_is_caught() -> None:
    """propagation's gRPC room reaching into the HTTP room is caught."""
    source = "from ..http._server import read_deadline\n"
    assert _check("propagation/grpc/_interceptors.py", source) == [
        "propagation/grpc/_interceptors.py:1: room grpc of propagation imports room http"
    ]


def test_a_shared_module_importing_a_room_is_caught() -> None:
    """A module the rooms share must not depend on one of them."""
    source = "from .db import _common\nfrom .http._server import x\n"
    assert _check("propagation/_client.py", source) == [
        "propagation/_client.py:1: a shared module of propagation imports room db",
        "propagation/_client.py:2: a shared module of propagation imports room http",
    ]


def test_a_room_using_the_shared_modules_and_a_facade_using_a_room_are_fine() -> None:
    """Rooms import what they share; the public facade modules re-export a room."""
    assert _check("propagation/db/_redis.py", "from .._client import begin\n") == []
    assert _check("propagation/db/_redis.py", "from ._common import options\n") == []
    assert _check("propagation/asgi.py", "from .http._asgi import DeadlineMiddleware\n") == []
