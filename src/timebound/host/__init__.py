"""The timebound host: ``timebound serve`` runs workflows behind an HTTP API, an operator UI,
Prometheus metrics and health checks (docs/host.md; needs ``pip install 'timebound[host]'``)::

    from timebound.host import Host, create_app, load_config

    host = Host.build(load_config({"workflows": "flows/", "actions": ["myapp.actions"]}))
    app = create_app(host)  # any ASGI server; `timebound serve` uses uvicorn

and drives one from Python with :class:`Client` / :class:`AsyncClient`.
"""

from __future__ import annotations

from ._app import create_app
from ._client import AsyncClient, Client
from ._config import Config, ConfigError, load_config
from ._host import Host
from ._serve import publish, serve
from ._wire import (
    Event,
    HostConflict,
    HostError,
    HostNotFound,
    HostRejected,
    HostUnauthorized,
    HostUnavailable,
    RunDetail,
    RunPage,
    telemetry_event,
)

__all__ = [
    "AsyncClient",
    "Client",
    "Config",
    "ConfigError",
    "Event",
    "Host",
    "HostConflict",
    "HostError",
    "HostNotFound",
    "HostRejected",
    "HostUnauthorized",
    "HostUnavailable",
    "RunDetail",
    "RunPage",
    "create_app",
    "load_config",
    "publish",
    "serve",
    "telemetry_event",
]
