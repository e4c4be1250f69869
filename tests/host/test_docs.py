"""Every Python example in docs/host.md runs and prints what it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/host.md")
ROOT = Path(__file__).resolve().parents[2]


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


def test_the_screenshots_the_page_shows_are_in_the_repository() -> None:
    """Every image docs/host.md shows is a PNG in docs/img (the UI tests retake them)."""
    page = ROOT / "docs" / "host.md"
    shown = re.findall(r"\]\((img/[^)]+)\)", page.read_text())
    assert {"img/host-run.png", "img/host-trace.png"} <= set(shown)
    for name in shown:
        assert (page.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
