"""The Python examples in docs/propagation.md run as written."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/propagation.md")


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_doc_example_runs(name: str, code: str) -> None:
    """Each python block executes (servers are defined, not started) and prints its promises."""
    run_example(name, code)


def test_doc_has_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(EXAMPLES) >= 6
