"""The Python examples in docs/databases.md run as written, against the real servers."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "databases.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int, postgres_dsn: str, redis_url: str) -> None:
    """Each python block executes without error."""
    exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), {"__name__": "doc"})


def test_doc_has_examples() -> None:
    """The page keeps its runnable examples (asyncpg, psycopg sync and pool, redis, metrics)."""
    assert len(BLOCKS) >= 6
