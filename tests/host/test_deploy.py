"""deploy/ (D8.18): the compose file's services and commands make sense to timebound's own parser
and configuration, the image recipe installs from Debian and PyPI only, the systemd unit passes
``systemd-analyze verify``, and every query of the Grafana dashboard names a metric (and labels)
a real host exports. No container runtime runs here: the image is not built (see docs/host.md)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from timebound.cli import build_parser
from timebound.host import load_config
from timebound.workflow import parse_definition

from .conftest import ROOT, Server, launch, stop
from .test_deferred_ops import _plant

DEPLOY = ROOT / "deploy"


def _compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def _parse(argv: list[str]) -> Any:
    """``timebound`` argv as the CLI would parse it (a bad option exits 2: SystemExit)."""
    return build_parser(argv).parse_args(argv)


def test_compose_has_postgres_two_hosts_and_a_worker() -> None:
    """The services, their images and their start order: the hosts and the worker wait for a
    healthy PostgreSQL; the hosts check readiness on /readyz; each host publishes its own port."""
    services = _compose()["services"]
    assert set(services) == {"postgres", "host-a", "host-b", "worker"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    ports = set()
    for name in ("host-a", "host-b", "worker"):
        service = services[name]
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert service["depends_on"] == {"postgres": {"condition": "service_healthy"}}
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    for name in ("host-a", "host-b"):
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])
        ports |= set(services[name]["ports"])
    assert len(ports) == 2
    assert services["worker"]["healthcheck"] == {"disable": True}


def test_compose_commands_and_settings_load_as_timebound_would(tmp_path: Path) -> None:
    """Each service's command parses with timebound's CLI; a host's environment and command
    load into a valid configuration (PostgreSQL, no worker, a token); the worker uses the same
    store; the mounted app's actions and definitions are there and valid."""
    document = _compose()
    services = document["services"]
    token = tmp_path / "token"
    token.write_text("a-token-long-enough-for-the-host\n")
    for name in ("host-a", "host-b"):
        args = _parse(services[name]["command"])
        assert args.command == "serve" and args.no_worker
        env = dict(services[name]["environment"], TIMEBOUND_TOKEN_FILE=str(token))
        options = {"host": args.host, "port": args.port, "worker": False}
        config = load_config(options, env)
        assert config.db.startswith("postgresql://") and "@postgres:5432/" in config.db
        assert config.token is not None and not config.worker and config.host == "0.0.0.0"
        assert services[name]["secrets"] == ["timebound_token"]
        assert services[name]["environment"]["TIMEBOUND_TOKEN_FILE"] == (
            "/run/secrets/timebound_token"
        )
    worker = _parse(services["worker"]["command"])
    assert worker.command == "worker"
    assert worker.db == services["host-a"]["environment"]["TIMEBOUND_DB"]
    assert document["secrets"]["timebound_token"]["file"] == "./token"
    app = DEPLOY / "app"
    assert services["host-a"]["volumes"] == ["./app:/app:ro"]
    assert (app / f"{worker.actions}.py").is_file()
    for flow in (app / "flows").iterdir():
        parse_definition(flow)


def test_the_dockerfile_installs_from_debian_and_pypi_only() -> None:
    """FROM Debian, python3 from apt, the package from the source tree with its dependencies
    from PyPI (no other index), a non-root user, the health check on /healthz, and an
    entrypoint and command the CLI parses."""
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms == ["debian:bookworm-slim"]
    assert "--index-url" not in text and "--extra-index-url" not in text
    assert "apt-get install -y --no-install-recommends python3" in text
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert "USER timebound" in lines
    assert "http://127.0.0.1:8080/healthz" in text
    entry = json.loads(next(x for x in lines if x.startswith("ENTRYPOINT"))[len("ENTRYPOINT") :])
    command = json.loads(next(x for x in lines if x.startswith("CMD"))[len("CMD") :])
    assert entry == ["timebound"]
    args = _parse(command)
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == "8080"


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` reports nothing for the unit (its ExecStart pointed at this
    machine's timebound, the one thing verify checks that the machine does not have)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    executable = str(Path(sys.executable).parent / "timebound")
    unit = (DEPLOY / "timebound.service").read_text()
    assert "ExecStart=/opt/timebound/bin/timebound serve" in unit
    local = tmp_path / "timebound.service"
    local.write_text(unit.replace("/opt/timebound/bin/timebound", executable))
    done = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout + done.stderr == "", done.stdout + done.stderr
    # The ExecStart's arguments are ones `timebound serve` takes.
    exec_start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert _parse(exec_start.split()[1:]).command == "serve"


def _samples(text: str) -> dict[str, set[str]]:
    """Metric sample names of an exposition, each with the label names it carries."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?", line)
        assert match is not None, line
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(3) or ""))
        found.setdefault(match.group(1), set()).update(labels)
    return found


def test_every_dashboard_query_names_what_a_real_host_exports(tmp_path: Path) -> None:
    """Scrape a real host that holds a deferred operation, has timed out a node and received a
    propagated deadline: every metric a dashboard query names is exported, with every label it
    groups by."""
    asyncio.run(_plant(f"sqlite:///{tmp_path}/host.db"))
    server = launch(tmp_path)
    try:
        _check_dashboard(server)
    finally:
        stop(server)


def _check_dashboard(server: Server) -> None:
    server.wait_run(server.start("bounded", {"sleep_s": 5}))
    r = server.client.get("/v1/runs", headers={"X-YaTaxi-Client-TimeoutMs": "5000"})
    assert r.status_code == 200
    # A request whose deadline has passed on arrival is answered 498 and counted as cut.
    late = server.client.get("/v1/runs", headers={"X-YaTaxi-Client-TimeoutMs": "0"})
    assert late.status_code == 498, late.text
    exported = _samples(httpx.get(f"{server.url}/metrics", timeout=30).text)
    dashboard = json.loads((DEPLOY / "grafana" / "timebound-host.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 8
    for query in queries:
        names = re.findall(r"\btimebound_[a-z_]+\b", query)
        assert names, query
        for name in names:
            assert name in exported, f"{name} (in {query!r}) is not exported"
        for group in re.findall(r"by \(([^)]*)\)", query):
            for label in (x.strip() for x in group.split(",")):
                assert any(label in exported[n] for n in names), (label, query)
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("timeouts by layer", "detection lag", "deferred polls", "admission"):
        assert topic in titles
