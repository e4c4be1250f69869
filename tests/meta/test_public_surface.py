"""The public surface speaks one vocabulary (D1.11-D1.16).

- every public package's ``__all__`` names what it exports;
- every exception it exports is a ``TimeboundError`` (the full tree: ``test_error_tree.py``);
- no public Python signature takes a span or an instant as a unit-suffixed number (``*_ms``,
  ``*_s``, ``*_seconds``...): spans are durations, instants ``Deadline``s. The exceptions are the
  stored rows, wire values and document fields listed in ``ALLOWED``, each with its reason;
- an old spelling kept for one release (D1.12) is out of the signature and names a keyword that
  is in it;
- nothing outside ``_core/_clock.py`` reads the clock (D1.1, D1.16).

The public packages are found by walking the source tree, so a package added later is covered.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import re
import tomllib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import timebound

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "timebound"

# Optional extras that may be missing here: their modules are skipped, not failed.
_EXTRAS = {"grpc", "httpx", "requests", "aiohttp", "asyncpg", "psycopg", "redis", "opentelemetry"}

#: A name that carries its unit: what a public Python signature must not take (D1.11).
UNIT_SUFFIX = re.compile(r"_(ms|s|us|ns|sec|secs|seconds|millis|minutes|hours)$")

#: Unit-suffixed names that stay, each a stored row, a wire value or a document field whose
#: name a source design fixes (D1.2, D1.11). Keyed by the owner's public dotted name.
ALLOWED: dict[str, dict[str, str]] = {
    # The durable and wire form of a deadline itself (D1.10).
    "timebound.Deadline.from_epoch_ms": {"epoch_ms": "the durable form, epoch milliseconds"},
    # A row of tb_deferred_ops as stored (D6.12): epoch-ms instants and the stored interval.
    "timebound.deferred.Operation": {
        "cancel_requested_ms": "stored row",
        "connector_updated_ms": "stored row",
        "created_ms": "stored row",
        "expires_ms": "stored row",
        "next_poll_ms": "stored row",
        "resumed_ms": "stored row",
        "retain_until_ms": "stored row",
        "retry_after_s": "stored row: the document's retry_after_seconds, whole seconds",
        "updated_ms": "stored row",
    },
    # The Retry-After header's whole seconds, as the 503 answer carries them.
    "timebound.deferred.Overloaded": {"retry_after_s": "wire: Retry-After, whole seconds"},
    # Arithmetic on the stored rows' epoch-ms instants (the poller's and the registry's).
    "timebound.deferred.Registry.next_instant": {"after_ms": "a stored epoch-ms instant"},
    "timebound.deferred.HostPolicy.lifetime_s": {"now_epoch_ms": "a stored epoch-ms instant"},
    "timebound.deferred.HostPolicy.lifetime_bound": {"now_epoch_ms": "a stored epoch-ms instant"},
    # The deadline header's value as it arrived (D4): the wire's milliseconds.
    "timebound.propagation.RequestState": {"deadline_received_ms": "wire: the header's ms"},
    # The event record's wall-clock instant (D10): a document field of the one event model.
    "timebound.telemetry.Event": {"epoch_ms": "event record field, epoch milliseconds"},
    # A workflow definition's document field, named by its source design (D6).
    "timebound.workflow.Definition": {"timeout_ms": "definition document field"},
    # A pipeline plan's region budget, named as the plan document names it (base_ms, D5).
    "timebound.pipeline.PlanTimeout": {
        "timeout_ms": "plan document's region budget, ms",
        "reserve_ms": "plan document's region reserve, ms",
    },
    # A pipeline trace's field, as its JSON document (the trace viewer's input) names it.
    "timebound.pipeline.Trace": {"started_epoch_ns": "trace document field"},
}


def _public_modules() -> Iterator[tuple[str, Any]]:
    names = ["timebound"]
    for info in pkgutil.walk_packages(timebound.__path__, "timebound."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = importlib.import_module(name)
        except ImportError as exc:
            if exc.name and exc.name.split(".")[0] in _EXTRAS:
                continue
            raise
        yield name, module


MODULES = list(_public_modules())


def _exports() -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for name, module in MODULES:
        for attr in getattr(module, "__all__", ()):
            with warnings.catch_warnings():  # a moved name still resolves, with its warning
                warnings.simplefilter("ignore", DeprecationWarning)
                value = getattr(module, attr, None)
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            yield f"{name}.{attr}", value


def _callables(where: str, value: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The public callables of one export: itself, and a class's constructor and methods."""
    if inspect.isclass(value):
        yield where, value
        # A class made of parts (workflow.Engine, deferred.Registry) has public methods in its
        # timebound bases too: the nearest definition of each name is the one users call.
        members: dict[str, Any] = {}
        for klass in value.__mro__:
            if klass.__module__.split(".")[0] == "timebound":
                for attr, member in vars(klass).items():
                    members.setdefault(attr, member)
        for attr, member in members.items():
            if attr.startswith("_") or isinstance(member, property):
                continue
            if isinstance(member, staticmethod | classmethod):
                member = member.__func__
            if callable(member):
                yield f"{where}.{attr}", member
    elif callable(value):
        yield where, value


def unit_suffixed(where: str, func: Callable[..., Any]) -> list[str]:
    """The parameters of ``func`` whose names carry a unit and are not allowed for ``where``."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    allowed = ALLOWED.get(where, {})
    return [p for p in params if UNIT_SUFFIX.search(p) and p not in allowed]


SIGNATURES = [pair for where, value in _exports() for pair in _callables(where, value)]


def test_every_public_all_resolves() -> None:
    """Every name a public package's __all__ lists is there, and every package has one."""
    missing = []
    for name, module in MODULES:
        exported = getattr(module, "__all__", None)
        if exported is None:
            missing.append(f"{name}: no __all__")
            continue
        with warnings.catch_warnings():  # a moved name still resolves, with its warning
            warnings.simplefilter("ignore", DeprecationWarning)
            missing += [f"{name}.{attr}" for attr in exported if not hasattr(module, attr)]
    assert not missing, missing


def test_the_walk_sees_every_engine() -> None:
    """A broken walk would pass the tests below vacuously."""
    names = {w for w, _ in SIGNATURES}
    for expected in (
        "timebound.workflow.Engine",
        "timebound.workflow.Engine.close",
        "timebound.deferred.HostPolicy",
        "timebound.deferred.Poller",
        "timebound.pipeline.Catalog.task",
        "timebound.host.Config",
        "timebound.fail_after",
    ):
        assert expected in names, expected


def test_every_public_exception_is_a_timebound_error() -> None:
    wrong = [
        where
        for where, value in _exports()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and not issubclass(value, Warning)
        and not issubclass(value, timebound.TimeboundError)
    ]
    assert not wrong, wrong


def test_no_public_signature_takes_a_unit_suffixed_number() -> None:
    """Spans are durations and instants Deadlines (D1.11); ALLOWED says why each other stays."""
    found = {where: names for where, func in SIGNATURES if (names := unit_suffixed(where, func))}
    assert not found, found


def test_no_public_dataclass_field_carries_a_unit() -> None:
    """A public dataclass's fields read back as its constructor takes them."""
    found = {}
    for where, value in _exports():
        if inspect.isclass(value) and dataclasses.is_dataclass(value):
            allowed = ALLOWED.get(where, {})
            names = [
                f.name
                for f in dataclasses.fields(value)
                if UNIT_SUFFIX.search(f.name) and f.name not in allowed
            ]
            if names:
                found[where] = names
    assert not found, found


def test_every_allowed_name_still_exists() -> None:
    """The allow-list shrinks with the code: an entry for a name that went away is removed."""
    by_name = dict(SIGNATURES)
    stale = []
    for where, names in ALLOWED.items():
        func = by_name.get(where)
        params = set() if func is None else set(inspect.signature(func).parameters)
        stale += [f"{where}({n})" for n in names if n not in params]
    assert not stale, stale


def test_old_spellings_are_out_of_the_signature_and_name_a_new_keyword() -> None:
    """Each renamed keyword (D1.12) is absent from the signature; what it became is there."""
    renamed = [(w, f) for w, f in SIGNATURES if hasattr(f, "__renamed__")]
    renamed += [
        (w, f.__init__)
        for w, f in SIGNATURES
        if hasattr(getattr(f, "__init__", None), "__renamed__")
    ]
    assert len(renamed) >= 8, "the walk no longer sees the shims"
    for where, func in renamed:
        params = inspect.signature(func).parameters
        for old, spec in func.__renamed__.items():
            assert old not in params, (where, old)
            assert spec.new in params, (where, old, spec.new)


def test_the_check_fails_on_an_old_spelling() -> None:
    """The checker itself: the spellings this test replaced are caught."""

    def old_engine(db: str, *, lease_ms: int = 30_000, sweep_ms: int = 1_000) -> None: ...

    def old_close(*, drain_s: float = 0.0) -> None: ...

    def old_policy(min_retry_after_s: int = 1, max_ttl_seconds: int = 900) -> None: ...

    assert unit_suffixed("x.Engine", old_engine) == ["lease_ms", "sweep_ms"]
    assert unit_suffixed("x.Engine.close", old_close) == ["drain_s"]
    assert unit_suffixed("x.HostPolicy", old_policy) == ["min_retry_after_s", "max_ttl_seconds"]


# The clock (D1.1): one module reads it -------------------------------------------------------

#: Clock reads: ``module.attribute`` names that read a clock.
_CLOCK_READS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "monotonic_ns"),
    ("time", "perf_counter"),
    ("time", "perf_counter_ns"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
}
#: The one reader, and virtual time, which measures real silence under a virtual clock.
_CLOCK_READERS = {"_core/_clock.py", "testing/_virtual.py"}


def clock_reads(source: str) -> list[str]:
    """``time.time()``-style reads in ``source``: attribute reads, and names imported from
    ``time``/``datetime`` that read a clock."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
            if (base, node.attr) in _CLOCK_READS:
                found.append(f"line {node.lineno}: {base}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            for alias in node.names:
                if ("time", alias.name) in _CLOCK_READS:
                    found.append(f"line {node.lineno}: from time import {alias.name}")
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).as_posix() not in _CLOCK_READERS
    ),
)
def test_nothing_outside_the_clock_module_reads_the_clock(path: str) -> None:
    assert clock_reads((SRC / path).read_text(encoding="utf-8")) == [], path


def test_the_clock_check_catches_each_spelling() -> None:
    assert clock_reads("import time\nx = time.time()") == ["line 2: time.time"]
    assert clock_reads("from time import monotonic") == ["line 1: from time import monotonic"]
    assert clock_reads("import datetime\ndatetime.datetime.now()") == ["line 2: datetime.now"]
    assert clock_reads("from ._core import _clock\n_clock.wall_ms()") == []


def test_the_lint_rule_bans_the_clock_outside_its_module() -> None:
    """ruff's banned-api rule (TID251) says the same in an editor; only the clock module, virtual
    time and code outside the library are exempt."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "TID251" in lint["select"]
    banned = set(lint["flake8-tidy-imports"]["banned-api"])
    assert {"time.time", "time.monotonic", "time.perf_counter", "datetime.datetime.now"} <= banned
    exempt = {path for path, rules in lint["per-file-ignores"].items() if "TID251" in rules}
    in_library = {p for p in exempt if p.startswith("src/")}
    assert in_library == {f"src/timebound/{p}" for p in _CLOCK_READERS}
