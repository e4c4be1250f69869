"""The gRPC adapter module exports exactly its public names."""

from __future__ import annotations

import sys

import timebound.propagation.grpc as module


def test_all_is_complete_and_importable() -> None:
    """Every name in ``__all__`` exists and every public attribute is listed (nothing leaks)."""
    exported = set(module.__all__)
    assert all(hasattr(module, attr) for attr in exported)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, type(sys)) and attr != "annotations"
    }
    assert public <= exported, sorted(public - exported)
