"""The chaos tests' own PostgreSQL cluster, which they may restart (never the shared server).

``initdb`` into a temporary directory with the distribution's binaries, ``pg_ctl start`` on a
free loopback port with ``trust`` auth; stopped and removed at the end of the session. Absent
binaries skip the tests with the reason, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """A private PostgreSQL server: its DSN, and a restart the tests may call at any instant."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self._bin, self._root = bin_dir, root
        self._data = root / "data"
        self.port = _free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        # initdb refuses to run as root: the cluster belongs to the postgres OS user then.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        if self._as:
            shutil.chown(self._root, "postgres")
        self._run(
            str(self._bin / "initdb"), "-D", str(self._data), "-U", "postgres",
            "--auth=trust", "--no-sync",
        )  # fmt: skip

    def _ctl(self, *args: str) -> None:
        options = (
            f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )
        self._run(
            str(self._bin / "pg_ctl"), "-D", str(self._data), "-l", str(self._root / "log"),
            "-w", "-o", options, *args,
        )  # fmt: skip

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """Stop fast (open connections are dropped mid-transaction) and start again."""
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        self._ctl("stop", "-m", "immediate")


@pytest.fixture(scope="session")
def chaos_cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of the session's own, on a free port of 127.0.0.1."""
    bin_dir = _bin_dir()
    if bin_dir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        reason = "PostgreSQL server binaries (/usr/lib/postgresql/*/bin) are absent"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI=true requires them (install postgresql)")
        pytest.skip(f"{reason}; install them to run the chaos tests")
    root = Path(tempfile.mkdtemp(prefix="tb-chaos-pg-"))
    cluster = Cluster(bin_dir, root)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        except subprocess.CalledProcessError:
            pass  # never started, or already stopped
        shutil.rmtree(root, ignore_errors=True)
