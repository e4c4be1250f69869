"""Package contracts: public names, stdlib-only core, layering (docs/design/README.md)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "timebound"

# Public modules whose __all__ must be exactly their public surface.
PUBLIC_MODULES = ["timebound", "timebound.testing", "timebound.telemetry", "timebound.propagation"]

# Which top-level packages each layer may import from timebound (dependencies point down only).
LAYERS = {
    "_core": set(),
    "testing": {"_core"},
    "telemetry": {"_core"},
    "policies": {"_core", "telemetry"},
    "_engine": {"_core", "telemetry", "policies"},
    "dsl": {"_core", "telemetry", "policies", "_engine"},
    "pipeline": {"_core", "telemetry", "policies", "_engine"},
    "workflow": {"_core", "telemetry", "policies", "_engine"},
    "deferred": {"_core", "telemetry", "policies", "_engine"},
    "propagation": {"_core", "telemetry", "policies"},
}


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_complete_and_importable(name: str) -> None:
    """Every name in __all__ exists, and every public attribute is in __all__ (nothing leaks)."""
    module = importlib.import_module(name)
    exported = set(module.__all__)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr!r}"
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, type(sys))  # submodules are fine
        and attr not in {"annotations"}
    }
    assert public <= exported, f"{name} leaks {sorted(public - exported)}"


def test_fixed_public_names() -> None:
    """The names the foundation issue fixes are importable from timebound."""
    import timebound

    for attr in [
        "Deadline",
        "current_deadline",
        "remaining",
        "fail_after",
        "fail_at",
        "move_on_after",
        "move_on_at",
        "no_deadline",
        "checkpoint",
        "acheckpoint",
        "spawn_background",
        "TimeboundError",
        "DeadlineExceeded",
        "RetryExhausted",
        "ConfigurationError",
    ]:
        assert hasattr(timebound, attr), attr
    assert issubclass(timebound.DeadlineExceeded, TimeoutError)
    assert issubclass(timebound.ConfigurationError, ValueError)


def test_core_imports_only_stdlib() -> None:
    """`import timebound` pulls in nothing outside the standard library (no trio, no httpx)."""
    code = (
        "import sys, timebound, timebound.testing._virtual;"
        "mods = {m.split('.')[0] for m in sys.modules};"
        "std = set(sys.stdlib_module_names) | {'timebound', '__main__', 'sitecustomize', "
        "'_distutils_hack', '__editable___timebound_0_1_0_finder'};"
        "print(sorted(m for m in mods if m not in std and not m.startswith('_')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", f"non-stdlib modules imported by the core: {out}"


def _timebound_imports(path: pathlib.Path) -> set[str]:
    """Top-level timebound sub-packages a file imports (absolute or relative)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(SRC)
    own = rel.parts[0] if len(rel.parts) > 1 else ""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("timebound."):
                found.add(node.module.split(".")[1])
            elif node.level > 0:
                depth = len(rel.parts) - 1  # package depth of this file
                if node.level > depth:
                    continue
                base = list(rel.parts[: depth - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
                if parts:
                    found.add(parts[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("timebound."):
                    found.add(alias.name.split(".")[1])
    found.discard(own)
    return found


PACKAGES = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())


def test_every_package_has_a_layer() -> None:
    """Each sub-package is placed in the layering, so the contract below covers it."""
    unplaced = [p for p in PACKAGES if p not in LAYERS and p not in {"cli", "host"}]
    assert not unplaced, f"add {unplaced} to LAYERS"


@pytest.mark.parametrize("layer", [p for p in PACKAGES if p in LAYERS])
def test_dependencies_point_down(layer: str) -> None:
    """A layer imports only the layers below it (docs/design/README.md)."""
    root = SRC / layer
    allowed = LAYERS[layer]
    for path in root.rglob("*.py"):
        bad = {dep for dep in _timebound_imports(path) if dep in LAYERS and dep not in allowed}
        assert not bad, (
            f"{path.relative_to(SRC)} imports {sorted(bad)} (allowed: {sorted(allowed)})"
        )
