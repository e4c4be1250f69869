"""The examples in the README and the core docs run and print what they promise."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

PAGES = ("README.md", "docs/deadlines.md", "docs/testing.md", "docs/blocking.md")


@pytest.mark.parametrize(("name", "code"), examples(*PAGES))
def test_example_runs(name: str, code: str) -> None:
    """The example executes without error and prints what its comments promise."""
    run_example(name, code)


def test_every_page_has_examples() -> None:
    """Each page keeps at least one runnable example."""
    for page in PAGES:
        assert examples(page), page
