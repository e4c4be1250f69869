"""``bench/host_load.py`` stopped by SIGTERM once its host is up (``_common.signals_unwind``):
the ``timebound serve`` process it started is gone and the PostgreSQL schema it made dropped,
as on a normal end (before, Python's default SIGTERM ended the script and left both behind).

The run reads its own host's pid and schema from the script's output, and only ever looks at,
kills or drops those: another benchmark on this machine may have hosts and ``tbbench_*``
schemas of its own. Each run is a ``--smoke`` run stopped as soon as its host answers, a few
seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "host_load.py"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _schema_exists(dsn: str, schema: str) -> bool:
    import asyncpg

    async def query() -> bool:
        conn = await asyncpg.connect(dsn)
        try:
            sql = "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1"
            return await conn.fetchval(sql, schema) is not None
        finally:
            await conn.close()

    return asyncio.run(query())


def _drop(dsn: str, schema: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def _terminated_once_up(tmp: Path, dsn: str, *args: str) -> tuple[int, str, int, str | None]:
    """Run the script, SIGTERM it once its host is ready: (its exit status, its output, the
    host's pid, the schema it announced)."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--smoke", *args],
        cwd=tmp,
        env={**os.environ, "TB_BENCH_PG": dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    pid, schema = 0, None
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("PostgreSQL schema "):
                schema = line.split()[-1]
            if line.startswith("host pid "):
                pid = int(line.split()[2])
                break
        assert pid, "".join(seen)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(seen) + rest, pid, schema


def _clean(pid: int, dsn: str, schema: str | None) -> None:
    """What a failing run left: this run's own host and schema, nothing else."""
    if pid and _alive(pid):
        os.kill(pid, signal.SIGKILL)
    if schema is not None:
        _drop(dsn, schema)


def test_sigterm_stops_the_host_and_drops_the_schema(tmp_path: Path, postgres_dsn: str) -> None:
    """On PostgreSQL: the host is stopped and the run's schema dropped; exit status 143."""
    status, output, pid, schema = _terminated_once_up(
        tmp_path, postgres_dsn, "--stores", "postgres"
    )
    try:
        assert schema is not None and schema.startswith("tbbench_"), output
        left = (_alive(pid), _schema_exists(postgres_dsn, schema))
    finally:
        _clean(pid, postgres_dsn, schema)
    assert status == 128 + signal.SIGTERM, output
    assert left == (False, False), output


def test_sigterm_stops_the_sqlite_host(tmp_path: Path) -> None:
    """The plain smoke run (SQLite, no PostgreSQL needed): its host is stopped too."""
    status, output, pid, _ = _terminated_once_up(tmp_path, "postgresql://unused")
    try:
        left = _alive(pid)
    finally:
        _clean(pid, "", None)
    assert status == 128 + signal.SIGTERM, output
    assert not left, output
    assert not [p for p in tmp_path.iterdir()], "the run's temporary files are removed too"


@pytest.mark.parametrize("value", ["mysql", "sqlite,", ""])
def test_an_unknown_store_is_refused_naming_the_option(tmp_path: Path, value: str) -> None:
    """``--stores`` takes sqlite and postgres only; anything else is a usage error."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--stores", value],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--stores" in proc.stderr and "sqlite and postgres" in proc.stderr
