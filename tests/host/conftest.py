"""A real host process (``python -m timebound serve``) on 127.0.0.1 and a random port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]

QUICK = {
    "id": "quick",
    "timeout_ms": 60_000,
    "initial_node": "a",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [{"id": "a", "action_id": "work"}, {"id": "b", "action_id": "work"}],
    "transitions": [{"id": "ab", "from": "a", "to": "b"}],
}
# Node "a" times out after 200 ms when asked to sleep longer.
BOUNDED = {
    "id": "bounded",
    "timeout_ms": 60_000,
    "initial_node": "a",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [{"id": "a", "action_id": "work", "timeout_ms": 200}],
}

# A fan-out of naps whose join waits 400 ms from the first arrival, then goes on with what came.
FANOUT = {
    "id": "fanout",
    "timeout_ms": 60_000,
    "initial_node": "start",
    "actions": [
        {"id": "nap", "kind": "python", "implementation": {"handler": "nap"}},
        {"id": "noop", "kind": "python", "implementation": {"handler": "noop"}},
    ],
    "nodes": [
        {"id": "start", "action_id": "noop"},
        {"id": "probe", "action_id": "nap"},
        {"id": "report", "action_id": "noop"},
    ],
    "transitions": [
        {"id": "spread", "from": "start", "to": "probe", "foreach": "input.delays"},
        {
            "id": "join",
            "from": "probe",
            "to": "report",
            "synchronization": {
                "strategy": "all",
                "sibling_group": "spread",
                "timeout_ms": 400,
                "on_timeout": "proceed_with_available",
                "merge": {"source": "_branch.output", "target": "state.naps", "strategy": "append"},
            },
        },
    ],
}


def csrf_of(page: str) -> str:
    """The CSRF token a UI page's forms carry (bound to the session cookie it was sent with)."""
    return page.split('name="csrf" value="')[1].split('"')[0]


class Server:
    """A running host: its base URL, its output so far, and a client."""

    def __init__(self, proc: subprocess.Popen[str], url: str, token: str | None) -> None:
        self.proc, self.url, self.token = proc, url, token
        # Drained all along: a full pipe would block the server at its next log line.
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._drain, name="host-output", daemon=True)
        self._reader.start()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=url, headers=headers, timeout=30)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def wait_run(self, run_id: str) -> dict[str, Any]:
        """The run's detail once it has ended (polls; the server's clock decides, not ours)."""
        for _ in range(600):
            detail: dict[str, Any] = self.client.get(f"/v1/runs/{run_id}").json()
            if detail["run"]["status"] != "running":
                return detail
            time.sleep(0.05)
        raise AssertionError(f"run {run_id} did not end")

    def start(self, definition: str, input: Any = None, **more: Any) -> str:
        r = self.client.post(f"/v1/workflows/{definition}/runs", json={"input": input, **more})
        assert r.status_code == 201, r.text
        run_id: str = r.json()["run_id"]
        return run_id


def launch(
    tmp: Path, *args: str, env: dict[str, str] | None = None, token: str | None = None
) -> Server:
    flows = tmp / "flows"
    flows.mkdir(exist_ok=True)
    (flows / "quick.json").write_text(json.dumps(QUICK))
    (flows / "bounded.yaml").write_text(json.dumps(BOUNDED))  # JSON is YAML
    (flows / "fanout.yml").write_text(json.dumps(FANOUT))
    argv = [sys.executable, "-m", "timebound", "serve", "--port", "0"]
    argv += ["--db", f"sqlite:///{tmp}/host.db", "--actions", "tests.host.host_actions"]
    argv += ["--workflows", str(flows), *args]
    if token is not None:
        (tmp / "token").write_text(token + "\n")
        argv += ["--token-file", str(tmp / "token")]
    # The host reads TIMEBOUND_* variables: only the test's own reach it.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    # The repository (for ``tests.host``) before what the test run was given (a checkout's
    # ``src`` ahead of an installed copy): the server runs the code under test.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full_env = {**inherited, "PYTHONPATH": path, **(env or {})}
    proc = subprocess.Popen(
        argv, cwd=tmp, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if "listening on" not in first:
        proc.kill()
        raise AssertionError(f"the host did not start: {first}{proc.stdout.read()}")
    url = first.split("listening on ")[1].split()[0].rstrip("/")
    server = Server(proc, url, token)
    for _ in range(200):  # until the lifespan has opened the engine
        try:
            if server.client.get("/readyz").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the host never became ready")


def stop(server: Server) -> str:
    """SIGTERM, wait for the graceful exit, and return the rest of its output."""
    server.client.close()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        server._reader.join()
        raise AssertionError(f"the host did not stop on SIGTERM: {''.join(server.output)}")
    server._reader.join()
    return "".join(server.output)


@pytest.fixture(scope="module")
def host_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def make(*args: str, token: str | None = None) -> Server:
        server = launch(tmp_path_factory.mktemp("host"), *args, token=token)
        started.append(server)
        return server

    yield make
    for server in started:
        if server.proc.poll() is None:
            stop(server)


@pytest.fixture(scope="module")
def host(host_factory: Callable[..., Server]) -> Server:
    """One open host (no token) shared by a module's read-mostly tests."""
    return host_factory()


@pytest.fixture(scope="module")
def secured(host_factory: Callable[..., Server]) -> Server:
    """A host with a token configured."""
    return host_factory(token="s3cret-token-for-tests")


class Schemas:
    """Fresh PostgreSQL schemas for host processes, each dropped by :meth:`drop_all`."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.made: list[str] = []

    def url(self) -> str:
        """A store URL in a schema no other test uses (the host creates it at start)."""
        schema = f"tbhost_{uuid.uuid4().hex[:12]}"
        self.made.append(schema)
        return f"{self.dsn}?schema={schema}"

    def drop_all(self) -> None:
        import asyncpg

        async def drop(schemas: list[str]) -> None:
            conn = await asyncpg.connect(self.dsn)
            try:
                for schema in schemas:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

        if self.made:
            asyncio.run(drop(self.made))
            self.made.clear()


@pytest.fixture(scope="session")
def pg_schemas(postgres_dsn: str) -> Iterator[Schemas]:
    """Schemas made during the session, dropped at its end."""
    schemas = Schemas(postgres_dsn)
    try:
        yield schemas
    finally:
        schemas.drop_all()


@pytest.fixture
def pg_url(postgres_dsn: str) -> Iterator[str]:
    """A PostgreSQL store URL in a fresh schema, dropped after the test."""
    schemas = Schemas(postgres_dsn)
    try:
        yield schemas.url()
    finally:
        schemas.drop_all()
