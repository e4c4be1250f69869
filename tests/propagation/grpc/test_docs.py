"""The Python examples in docs/propagation-grpc.md run as written."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "propagation-grpc.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int) -> None:
    """Each python block executes without error (real servers on 127.0.0.1:0)."""
    exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), {"__name__": "doc"})


def test_doc_has_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(BLOCKS) >= 4
