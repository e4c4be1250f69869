"""The Python examples in docs/databases.md run as written, against the real servers."""

from __future__ import annotations

import pytest

from tests.doc_examples import examples, run_example

EXAMPLES = examples("docs/databases.md")


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize(("name", "code"), EXAMPLES)
def test_doc_example_runs(name: str, code: str, postgres_dsn: str, redis_url: str) -> None:
    """Each python block executes and prints what it promises."""
    run_example(name, code)


def test_doc_has_examples() -> None:
    """The page keeps its runnable examples (asyncpg, psycopg sync and pool, redis, metrics)."""
    assert len(EXAMPLES) >= 6
