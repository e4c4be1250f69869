"""Stores on both backends: SQLite in a temporary directory, PostgreSQL in a unique schema."""

from __future__ import annotations

from tests.workflow.conftest import store_url  # noqa: F401  (the same parametrised fixture)
