"""Engines on both stores: SQLite in a temporary directory, PostgreSQL in a unique schema."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from timebound import workflow as wf


def _drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@contextmanager
def _pg_store(dsn: str) -> Iterator[str]:
    """A PostgreSQL store URL in a schema of its own, dropped afterwards."""
    schema = f"tbwf_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{dsn}?schema={schema}"
    finally:
        _drop_schema(dsn, schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL on each backend (the same behaviour suite runs on both)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/runs.db"
        return
    with _pg_store(request.getfixturevalue("postgres_dsn")) as url:
        yield url


@pytest.fixture
def pg_store_url(postgres_dsn: str) -> Iterator[str]:
    """A fresh PostgreSQL store URL, for what only a shared store can show (races)."""
    with _pg_store(postgres_dsn) as url:
        yield url


@pytest.fixture
def make_engine(store_url: str, request: pytest.FixtureRequest) -> Callable[..., wf.Engine]:
    """Build an engine on the test's store with the given handlers."""
    if store_url.startswith("postgresql"):
        # Real I/O under virtual time: the store holds autojump during every transaction
        # (_clock.real_io), so a slow query never lets time leap to a far timer (it once leapt
        # 300 s to asyncpg's pool timer mid-query at load ~10). The threshold covers the waits
        # outside transactions (connecting, LISTEN notifications).
        clock = request.getfixturevalue("virtual_clock")
        clock.autojump_threshold = 0.25

    def make(actions: dict[str, Any], *definitions: dict[str, Any], **kw: Any) -> wf.Engine:
        engine = wf.Engine(db=store_url, actions=actions, **kw)
        for d in definitions:
            engine.register(d)
        return engine

    return make


@pytest.fixture
def pg_url(postgres_dsn: str) -> Iterator[str]:
    """A PostgreSQL store URL in a fresh schema (for tests that are about many workers)."""
    schema = f"tbwf_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{postgres_dsn}?schema={schema}"
    finally:
        _drop_schema(postgres_dsn, schema)
