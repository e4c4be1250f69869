"""The host's state: configuration, the workflow engine, its definitions and its metrics.

Everything here belongs to one :class:`Host` (no process-wide registry): two hosts in one
process share nothing.
"""

from __future__ import annotations

import hmac
import importlib
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from ..workflow import Definition, DefinitionError, Engine
from ._config import Config, ConfigError

__all__ = ["Host", "load_actions", "load_definitions"]

_DEFINITION_SUFFIXES = (".json", ".yaml", ".yml")


def load_actions(modules: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """The module-level public callables of each module, by name; a name in two modules is an
    error (which handler a definition meant would be a guess)."""
    handlers: dict[str, Callable[..., Any]] = {}
    origin: dict[str, str] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(
                f"actions: cannot import {name!r}: {type(exc).__name__}: {exc}"
            ) from None
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not callable(obj) or isinstance(obj, type):
                continue
            if attr in handlers and handlers[attr] is not obj:
                raise ConfigError(
                    f"actions: handler {attr!r} is defined in both {origin[attr]!r} and {name!r}"
                )
            handlers[attr], origin[attr] = obj, name
    return handlers


def load_definitions(engine: Engine, directory: str | None) -> dict[str, Definition]:
    """Register every ``*.json``, ``*.yaml`` and ``*.yml`` file of ``directory``."""
    found: dict[str, Definition] = {}
    if directory is None:
        return found
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"workflows: {directory!r} is not a directory")
    for path in sorted(p for p in root.iterdir() if p.suffix in _DEFINITION_SUFFIXES):
        try:
            definition = engine.register(path)
        except DefinitionError as exc:
            raise ConfigError(f"workflows: {path}: {exc}") from None
        found[definition.id] = definition
    return found


class Host:
    """One served host: build it with :meth:`build`, serve :func:`timebound.host.create_app`."""

    def __init__(self, config: Config, engine: Engine, definitions: dict[str, Definition]):
        self.config = config
        self.engine = engine
        self.definitions = definitions
        # UI sessions (random ids, kept in memory: a restart logs operators out).
        self.sessions: set[str] = set()
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "timebound_host_requests",
            "API and UI requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "timebound_host_request_seconds",
            "Time to answer a request, by route",
            ["route"],
            registry=self.registry,
        )

    @classmethod
    def build(cls, config: Config, actions: Mapping[str, Callable[..., Any]] | None = None) -> Host:
        """Import ``config.actions`` (plus the ``actions`` given here, by name), open nothing
        yet, register the definitions (ConfigError if any is wrong, naming file and field)."""
        handlers = load_actions(config.actions)
        for name in set(handlers) & set(actions or {}):
            raise ConfigError(f"actions: handler {name!r} is given twice")
        engine = Engine(db=config.db, actions={**handlers, **(actions or {})}, worker=config.worker)
        return cls(config, engine, load_definitions(engine, config.workflows))

    def token_ok(self, presented: str | None) -> bool:
        """Whether a presented token is the configured one (constant-time, D8.1)."""
        if self.config.token is None:
            return True
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode(), self.config.token.encode())

    def new_session(self) -> str:
        session = secrets.token_urlsafe(32)
        self.sessions.add(session)
        return session
