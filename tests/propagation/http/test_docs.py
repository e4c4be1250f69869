"""The Python examples in docs/propagation.md run as written."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "propagation.md"
BLOCKS = re.findall(r"^( *)```python\n(.*?)^\1```", DOC.read_text(), re.S | re.M)


def _dedent(indent: str, code: str) -> str:
    return "\n".join(line[len(indent) :] for line in code.splitlines())


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int) -> None:
    """Each python block executes without error (servers are defined, not started)."""
    indent, code = BLOCKS[index]
    exec(compile(_dedent(indent, code), f"{DOC.name}[{index}]", "exec"), {"__name__": "doc"})


def test_doc_has_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(BLOCKS) >= 6
