"""Every Python example in docs/policies.md and docs/telemetry.md runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.doc_examples import examples, run_example


@pytest.mark.parametrize(("name", "code"), examples("docs/policies.md", "docs/telemetry.md"))
def test_example_runs_and_prints_what_it_promises(name: str, code: str) -> None:
    """The example executes without error and prints exactly what its comments promise."""
    run_example(name, code)


@pytest.mark.parametrize(
    "module", ["timebound.policies._decorator", "timebound.telemetry.prometheus"]
)
def test_docstring_examples(module: str) -> None:
    """The examples in public docstrings pass as doctests."""
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0
    assert result.failed == 0
