"""Every Python example in docs/deferred.md runs and prints what its comments promise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.doc_examples import examples, run_example
from timebound.deferred import validate_operation

EXAMPLES = examples("docs/deferred.md")
DOC = Path(__file__).resolve().parents[2] / "docs" / "deferred.md"


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_example_runs_and_prints_what_it_promises(name: str, code: str) -> None:
    """The example executes and its output matches its `# comment` lines."""
    run_example(name, code)


def test_there_are_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(EXAMPLES) >= 4


def test_the_pages_wire_example_is_valid() -> None:
    """The accepted-operation document shown on the page passes the schema."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"accepted = (\{.*?\n\})", text, re.S)
    assert block is not None
    validate_operation(json.loads(block.group(1).replace(",\n}", "\n}")))
