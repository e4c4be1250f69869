"""Shared fixtures: real PostgreSQL and Redis when reachable.

Where a server is absent the tests that need it skip with a clear reason — except under
``CI=true``, where a missing service fails the run so it is never hidden.
"""

from __future__ import annotations

import os
import socket

import pytest

PG_HOST, PG_PORT = "127.0.0.1", 5432
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
PG_DSN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _require(name: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    reason = f"{name} is not reachable at {host}:{port}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires it (start the service before the tests)")
    pytest.skip(f"{reason}; start it to run this test")


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """DSN of the test PostgreSQL database (database ``test``, user ``postgres``)."""
    _require("PostgreSQL", PG_HOST, PG_PORT)
    return PG_DSN


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis server."""
    _require("Redis", REDIS_HOST, REDIS_PORT)
    return REDIS_URL
