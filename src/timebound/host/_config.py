"""The host's configuration: command-line options over environment variables over a TOML file.

Every value is checked here, before anything binds or opens a store, so ``timebound serve
--check`` and a real start refuse the same mistakes with the same message (naming the option and
where it came from).
"""

from __future__ import annotations

import ipaddress
import math
import re
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .._core._durations import format_duration, to_seconds
from .._core._errors import ConfigurationError
from .._core._renamed import Renamed, renamed

__all__ = ["Config", "ConfigError", "load_config"]

_ENV_PREFIX = "TIMEBOUND_"
# D8.6: the shortest token the host accepts, counted without whitespace (which it refuses).
MIN_TOKEN_CHARS = 16
# A host name as the Host header carries it (letters, digits, hyphens, dots; no port).
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?")


class ConfigError(ConfigurationError):
    """A configuration value is wrong: the message names the option and its source (a
    :class:`~timebound.ConfigurationError`, so an :class:`~timebound.InvalidInput`, D2.6)."""

    code = "host-config-error"


@dataclass(frozen=True)
class Config:
    """What ``timebound serve`` runs with (every field has a command-line option, an environment
    variable ``TIMEBOUND_<NAME>`` and a key in the TOML file's ``[host]`` table)."""

    db: str = "sqlite:///timebound.db"
    actions: tuple[str, ...] = ()
    # Modules whose ``connectors()`` give the deferred connectors, by deferred module name.
    connectors: tuple[str, ...] = ()
    workflows: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = field(default=None, repr=False)  # never printed
    max_body_bytes: int = 1_048_576
    # On SIGTERM: how long in-flight requests, then in-flight actions, may take to finish
    # (a duration; read back as seconds).
    drain: float = 10.0
    # D8.13: runs that ended longer ago than this (seconds) are pruned; math.inf keeps them all.
    retain: float = 7 * 86_400.0
    # D8.20: the most an operator may extend one run's deadlines, all extensions together (a
    # duration; read back as seconds).
    max_extension: float = 86_400.0
    page_size: int = 50
    # False: serve the API and UI only; `timebound worker` processes on the shared store do the
    # work (a one-process SQLite store is refused, nothing else could run its runs).
    worker: bool = True
    # D8.5: names the Host header may carry besides loopback names and IP addresses.
    allowed_hosts: tuple[str, ...] = ()
    # D8.9: proxies (addresses or networks) whose X-Forwarded-For/-Proto the host believes.
    forwarded_allow_ips: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A duration given in Python ("30s", a timedelta) is kept as the seconds it means (D1.11).
        for name in _SPANS:
            object.__setattr__(self, name, _span(name, getattr(self, name), f"Config({name}=…)"))

    @property
    def loopback(self) -> bool:
        return _is_loopback(self.host)

    # The old names, read for one release (D1.12).
    @property
    def drain_s(self) -> float:
        _warn_old("Config.drain_s", "Config.drain")
        return self.drain

    @property
    def max_extension_s(self) -> float:
        _warn_old("Config.max_extension_s", "Config.max_extension")
        return self.max_extension


Config.__init__ = renamed(  # type: ignore[method-assign]
    drain_s=Renamed("drain"), max_extension_s=Renamed("max_extension")
)(Config.__init__)

#: The spans of the configuration and the longest each may be (seconds).
_SPANS = {"drain": 3600.0, "max_extension": 31_536_000.0}
#: Keys (TOML, ``TIMEBOUND_*``, options) renamed by D1.11, accepted with a warning for one release.
_OLD_KEYS = {"drain_s": "drain", "max_extension_s": "max_extension"}


def _warn_old(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated; use {new} (a duration such as '30s', seconds or a timedelta)",
        DeprecationWarning,
        stacklevel=3,
    )


def _span(name: str, value: Any, where: str) -> float:
    """A span of the configuration: a duration from 0 up to its limit, as seconds."""
    high = _SPANS[name]
    try:
        seconds = to_seconds(value, option=name)
    except ConfigurationError:
        seconds = math.nan
    if not 0 <= seconds <= high:
        raise ConfigError(
            f"{where}: expected a duration in [0s, {format_duration(high)}] such as 30s or "
            f"2min (a number is seconds), got {value!r}"
        )
    return seconds


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_INT = {"port": (0, 65535), "max_body_bytes": (1, 1 << 30), "page_size": (1, 1000)}


def _words(value: Any) -> Any:
    """A list as it comes: a list (TOML, command line) or a comma/space separated string."""
    if isinstance(value, str):
        return [v for v in value.replace(",", " ").split() if v]
    return value


def _coerce(name: str, value: Any, source: str) -> Any:
    where = f"{name} ({source})"
    if name in ("actions", "connectors"):
        value = _words(value)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of module names")
        return tuple(value)
    if name == "allowed_hosts":
        value = _words(value)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of host names")
        names = tuple(v.lower().rstrip(".") for v in value)
        for v in names:
            if not _HOST_NAME.fullmatch(v):
                raise ConfigError(
                    f"{where}: {v!r} is not a host name (no scheme, port or path; IP addresses "
                    "are always allowed)"
                )
        return names
    if name == "forwarded_allow_ips":
        value = _words(value)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of proxy addresses or networks")
        for v in value:
            try:
                ipaddress.ip_network(v, strict=False)
            except ValueError:
                raise ConfigError(
                    f"{where}: {v!r} is not an IP address or network (such as 10.0.0.0/8)"
                ) from None
        return tuple(value)
    if name in _INT:
        low, high = _INT[name]
        try:
            number = int(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None or not low <= number <= high:
            raise ConfigError(f"{where}: expected an integer in [{low}, {high}], got {value!r}")
        return number
    if name == "worker":
        if isinstance(value, str) and value.lower() in _BOOL:
            return _BOOL[value.lower()]
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if name in _SPANS:
        if isinstance(value, str):
            try:  # a number of seconds, as the environment and the command line give it
                value = float(value)
            except ValueError:
                pass  # a duration string such as "30s"
        return _span(name, value, where)
    if name == "retain":
        return _retention(value, where)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string")
    return value


def _check_token(token: str, where: str) -> str:
    """D8.6: a token an attacker cannot guess by trying: at least ``MIN_TOKEN_CHARS`` printable
    ASCII characters (what a Bearer header carries), none of them whitespace."""
    advice = (
        f"use at least {MIN_TOKEN_CHARS} random characters, such as the output of "
        "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    )
    if not token.strip():
        raise ConfigError(f"{where}: the token is blank; {advice}")
    if any(c.isspace() for c in token):
        raise ConfigError(f"{where}: the token contains whitespace; {advice}")
    if not all(" " < c < "\x7f" for c in token):
        raise ConfigError(f"{where}: the token has characters other than printable ASCII; {advice}")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{where}: the token has {len(token)} of the {MIN_TOKEN_CHARS} characters it needs; "
            f"{advice}"
        )
    return token


def _retention(value: Any, where: str) -> float:
    """A retention period: a duration (``30d``, ``12h``, seconds) or ``never``."""
    if isinstance(value, str) and value.strip().lower() == "never":
        return math.inf
    try:
        seconds = to_seconds(value, option="retain", allow_zero=False)
    except ConfigurationError:
        seconds = math.nan
    if not 60 <= seconds < math.inf:
        raise ConfigError(
            f"{where}: expected a duration of at least 1min such as 7d or 12h, or never; "
            f"got {value!r}"
        )
    return seconds


def _read_token_file(path: str, source: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"token_file ({source}): cannot read {path!r}: {exc.strerror}") from None
    return _check_token(token, f"token_file ({source}): {path!r}")


def load_config(
    options: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Config:
    """Merge the TOML file's ``[host]`` table, then ``TIMEBOUND_*`` variables, then ``options``
    (command-line values; ``None`` means "not given"), and check the result (D8.1)."""
    names = {f.name for f in fields(Config)} | {"token_file"} | set(_OLD_KEYS)
    values: dict[str, Any] = {}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if config_file is not None:
        try:
            with open(config_file, "rb") as f:
                document = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"config file {config_file!r}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file!r}: {exc}") from None
        table = document.get("host", {})
        if not isinstance(table, dict):
            raise ConfigError(f"config file {config_file!r}: [host] must be a table")
        unknown = sorted(set(table) - names)
        if unknown:
            raise ConfigError(f"config file {config_file!r}: unknown key(s) {unknown} in [host]")
        layers.append((f"config file {config_file}", table))
    if env is not None:
        layers.append(
            (
                "environment",
                {
                    n: env[_ENV_PREFIX + n.upper()]
                    for n in names
                    if env.get(_ENV_PREFIX + n.upper())
                },
            )
        )
    if options is not None:
        layers.append(("command line", {k: v for k, v in options.items() if v is not None}))
    for source, layer in layers:
        for name, value in layer.items():
            if name in _OLD_KEYS:
                new_name = _OLD_KEYS[name]
                _warn_old(f"{name} ({source})", new_name)
                if new_name in layer:
                    raise ConfigError(f"{name} ({source}): give {new_name} only, not both")
                name = new_name
            if name == "token_file":
                values["token"] = _read_token_file(_coerce(name, value, source), source)
            elif name == "token":
                values["token"] = _check_token(_coerce(name, value, source), f"token ({source})")
            else:
                values[name] = _coerce(name, value, source)
    config = Config(**values)
    if config.token is None and not config.loopback:
        raise ConfigError(
            f"host {config.host!r} is not a loopback address and no token is configured: "
            "set --token-file (or TIMEBOUND_TOKEN) to serve beyond this machine (D8.1)"
        )
    if not config.worker and not config.db.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"worker = false needs a shared PostgreSQL store (db is {config.db.split(':', 1)[0]}"
            "://…): nothing else may run a SQLite store's runs"
        )
    return config
