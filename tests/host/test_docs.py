"""Every Python example in docs/host.md runs and prints what it promises."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/host.md")


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_example_runs_and_prints_what_it_promises(name: str, code: str) -> None:
    """The example executes and its output matches its promises."""
    run_example(name, code)


def test_there_are_examples() -> None:
    """The page keeps its runnable example."""
    assert len(EXAMPLES) >= 1
