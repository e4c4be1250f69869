"""The Python examples in docs/propagation-grpc.md run as written."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/propagation-grpc.md")


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_doc_example_runs(name: str, code: str) -> None:
    """Each python block executes (real servers on 127.0.0.1:0) and prints what it promises."""
    run_example(name, code)


def test_doc_has_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(EXAMPLES) >= 4
