"""Every Python example in docs/workflows.md runs and prints what its comments promise."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/workflows.md")


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_example_runs_and_prints_what_it_promises(name: str, code: str) -> None:
    """The example executes and its output matches its `# comment` lines."""
    run_example(name, code)


def test_there_are_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(EXAMPLES) >= 6
