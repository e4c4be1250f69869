"""schemathesis, every check, against a real host process: the API does what its OpenAPI
document says (statuses, media types, schemas, ``Allow`` on 405, auth on every operation), and
no generated request gets a 5xx (D8.8). Bounded by examples per operation and a fixed seed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from timebound.deferred import Registry

from .conftest import launch, stop
from .test_deferred_ops import _doc

CONFIG = Path(__file__).with_name("schemathesis.toml")
TOKEN = "schemathesis-token-0123456789"
# Per operation; about 15 s on an idle 2-core machine for the host's 15 operations.
EXAMPLES = 80


async def _plant(db: str) -> None:
    async with Registry(db) as registry:
        await registry.register(_doc("deferred:report.render:st1"), module="reports")


@pytest.mark.timeout(180)
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    """`st run --checks all` against /openapi.json reports no failure."""
    asyncio.run(_plant(f"sqlite:///{tmp_path}/host.db"))
    server = launch(tmp_path, "--drain-timeout", "1", token=TOKEN)
    try:
        result = subprocess.run(
            [
                *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG)),
                *("run", f"{server.url}/openapi.json", "--checks", "all"),
                *("--header", f"Authorization: Bearer {TOKEN}"),
                *("--max-examples", str(EXAMPLES), "--seed", "20"),
                *("--workers", "1", "--request-timeout", "30", "--no-color"),
            ],
            # Its cache and reports go to the test's directory, never into the repository.
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=170,
        )
    finally:
        stop(server)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert "Test cases:" in result.stdout
