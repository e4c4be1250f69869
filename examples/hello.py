"""Modules for ``hello.cst``."""

from __future__ import annotations

from timebound.dsl import ModuleRegistry

registry = ModuleRegistry()


@registry.module
def Greet(name: str) -> str:
    """Say hello."""
    return f"Hello, {name}!"
