"""Every Python example in docs/host.md runs and prints what it promises."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/host.md")


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_example_runs_and_prints_what_it_promises(
    name: str, code: str, request: pytest.FixtureRequest
) -> None:
    """The example executes and its output matches its promises (the PostgreSQL deployment
    needs the test server: skipped without it, failed under CI=true)."""
    if "TIMEBOUND_EXAMPLE_PG" in code:
        request.getfixturevalue("postgres_dsn")
    run_example(name, code)


def test_there_are_examples() -> None:
    """The page keeps its runnable example."""
    assert len(EXAMPLES) >= 1
