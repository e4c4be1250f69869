"""The database adapter modules export exactly their public names."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "timebound.propagation.asyncpg",
        "timebound.propagation.psycopg",
        "timebound.propagation.redis",
    ],
)
def test_all_is_complete_and_importable(name: str) -> None:
    """Every name in ``__all__`` exists and every public attribute is listed (nothing leaks)."""
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, attr) for attr in exported)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, type(sys)) and attr != "annotations"
    }
    assert public <= exported, sorted(public - exported)
