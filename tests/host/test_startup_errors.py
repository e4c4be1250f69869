"""``timebound serve`` start-up errors are one clear line and exit 2, never a traceback (D8.17):
a busy port, an unsupported or malformed store URL, a SQLite directory that does not exist."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


def _serve(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "timebound", "serve", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("timebound serve: ")
    for text in expected:
        assert text in done.stderr, done.stderr


def test_a_busy_port(tmp_path: Path) -> None:
    """A port another socket listens on: 'cannot listen on HOST:PORT: Address already in use'."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--port", str(port), "--db", f"sqlite:///{tmp_path}/h.db")
    _one_line(done, f"cannot listen on 127.0.0.1:{port}", "in use")


@pytest.mark.parametrize(
    ("db", "expected"),
    [
        ("mysql://db/runs", "unsupported store"),
        ("sqlite://relative.db", "a SQLite URL names a file"),
        ("sqlite:///no/such/dir/runs.db", "the directory 'no/such/dir'"),
        ("sqlite:////no-such-root-dir/runs.db", "the directory '/no-such-root-dir'"),
    ],
    ids=["unsupported", "relative-two-slashes", "missing-relative-dir", "missing-absolute-dir"],
)
def test_a_store_url_that_cannot_work(tmp_path: Path, db: str, expected: str) -> None:
    """Each store URL that cannot work is named in one line, exit 2."""
    _one_line(_serve(tmp_path, "--port", "0", "--db", db), "db: ", expected)
