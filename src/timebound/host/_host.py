"""The host's state: configuration, the workflow engine, its definitions and its metrics.

Everything here belongs to one :class:`Host` (no process-wide registry): two hosts in one
process share nothing.
"""

from __future__ import annotations

import hmac
import math
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from .._core._errors import ConfigurationError
from .._core._modules import load_module
from ..workflow import Definition, DefinitionError, Engine
from ._config import Config, ConfigError
from ._metrics import Metrics
from ._sessions import Sessions

__all__ = ["Host", "load_actions", "load_connectors", "load_definitions"]

_DEFINITION_SUFFIXES = (".json", ".yaml", ".yml")


def load_actions(modules: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """The module-level public callables of each module, by name; a name in two modules is an
    error (which handler a definition meant would be a guess)."""
    handlers: dict[str, Callable[..., Any]] = {}
    origin: dict[str, str] = {}
    for name in modules:
        module = _load(name, "actions")
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not callable(obj) or isinstance(obj, type):
                continue
            if attr in handlers and handlers[attr] is not obj:
                raise ConfigError(
                    f"actions: handler {attr!r} is defined in both {origin[attr]!r} and {name!r}"
                )
            handlers[attr], origin[attr] = obj, name
    return handlers


def load_connectors(modules: tuple[str, ...]) -> dict[str, Any]:
    """The deferred connectors of each module, by deferred module name: each module defines
    ``connectors()`` answering a mapping such as ``{"reports": HttpConnector(url)}``. Called
    here, once per host, so the host owns what it gets (and closes it when it stops)."""
    found: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name in modules:
        module = _load(name, "connectors")
        factory = getattr(module, "connectors", None)
        if not callable(factory):
            raise ConfigError(
                f"connectors: module {name!r} defines no connectors() function "
                "answering {deferred module name: connector}"
            )
        try:
            made = factory()
        except Exception as exc:
            raise ConfigError(
                f"connectors: {name}.connectors() failed: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(made, Mapping):
            raise ConfigError(
                f"connectors: {name}.connectors() answered {type(made).__name__}, not a mapping"
            )
        for key, connector in made.items():
            where = f"connectors: {name}.connectors()[{key!r}]"
            if not isinstance(key, str) or not key:
                raise ConfigError(f"{where}: a deferred module name is a non-empty string")
            missing = [m for m in ("status", "cancel") if not callable(getattr(connector, m, None))]
            if missing:
                raise ConfigError(f"{where}: not a connector (no {' or '.join(missing)} method)")
            if key in found:
                raise ConfigError(
                    f"connectors: module {key!r} has a connector in both {origin[key]!r} and "
                    f"{name!r}"
                )
            found[key], origin[key] = connector, name
    return found


def _load(spec: str, setting: str) -> types.ModuleType:
    """The module of a setting: a dotted name (found from the current directory too) or a
    ``.py`` file, imported as every ``timebound`` command imports one (D12.3)."""
    try:
        return load_module(spec, what=setting)
    except ConfigurationError as exc:
        raise ConfigError(str(exc), option=setting) from None


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

    def __init__(
        self,
        config: Config,
        engine: Engine,
        definitions: dict[str, Definition],
        connectors: Mapping[str, Any] | None = None,
    ):
        self.config = config
        self.engine = engine
        # The definitions this host knows by id (files at start, then PUTs and the store's).
        self.definitions = definitions
        # Connectors this host made from its configuration (closed when it stops).
        self.connectors = dict(connectors or {})
        # UI sessions and their CSRF key (in memory: a restart signs operators out, D8.7).
        self.sessions = Sessions()
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
        # /metrics (D8.12): the store's state, read once for all scrapes in flight.
        self.metrics = Metrics(self)

    @classmethod
    def build(cls, config: Config, actions: Mapping[str, Callable[..., Any]] | None = None) -> Host:
        """Import ``config.actions`` (plus the ``actions`` given here, by name), open nothing
        yet, register the definitions (ConfigError if any is wrong, naming file and field)."""
        handlers = load_actions(config.actions)
        for name in set(handlers) & set(actions or {}):
            raise ConfigError(f"actions: handler {name!r} is given twice")
        connectors = load_connectors(config.connectors)
        engine = Engine(
            db=config.db,
            actions={**handlers, **(actions or {})},
            worker=config.worker,
            deferred_connectors=connectors,
            retain=None if math.isinf(config.retain) else config.retain,  # D8.13
            max_extension=config.max_extension,
        )
        return cls(config, engine, load_definitions(engine, config.workflows), connectors)

    async def publish_definitions(self) -> None:
        """Store the definitions loaded from files (the engine is open). A file's (id, version)
        the store holds with another body stops the start: versions never change body; the
        highest stored version of an id, from a file or a PUT, is the one runs start."""
        for definition_id, definition in sorted(self.definitions.items()):
            try:
                await self.engine.publish(definition)
            except DefinitionError as exc:
                raise ConfigError(f"workflows: {definition_id!r}: {exc}") from None
        for stored in await self.engine.stored_definitions():
            self.definitions[stored.id] = stored

    async def aclose_connectors(self) -> None:
        """Close the connectors this host made (those with an ``aclose``, like HttpConnector)."""
        for connector in self.connectors.values():
            close = getattr(connector, "aclose", None)
            if callable(close):
                await close()

    def token_ok(self, presented: str | None) -> bool:
        """Whether a presented token is the configured one (constant-time, D8.1)."""
        if self.config.token is None:
            return True
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode(), self.config.token.encode())
