"""The Python examples in docs/breakdown.md run as written."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/breakdown.md")


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_doc_example_runs(name: str, code: str) -> None:
    run_example(name, code)


def test_doc_has_examples() -> None:
    assert len(EXAMPLES) >= 2
