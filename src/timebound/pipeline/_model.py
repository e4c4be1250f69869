"""The data model: keys, params (with origins), write effects and tasks, held by a Catalog."""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from .._core._renamed import Renamed

__all__ = [
    "ORIGINS",
    "FromParam",
    "KeyDef",
    "P",
    "ParamDef",
    "REGISTRY_KEYWORD",
    "Catalog",
    "deprecated_registry",
    "Switch",
    "TaskSpec",
    "Union",
    "Unknown",
]

# Where a resolved param value came from (a wrapper record's ``override_origin``).
ORIGINS = ("plan", "fragment", "request", "source", "default")
Rowset = Literal["preserve", "mutate", "unknown"]

_NO_DEFAULT: Any = type("_NoDefault", (), {"__repr__": lambda self: "<no default>"})()


def _check_id(kind: str, ident: object) -> str:
    if not isinstance(ident, str) or not ident or not ident.replace("_", "a").isalnum():
        raise ConfigurationError(f"{kind} id must be a non-empty identifier, got {ident!r}")
    return ident


def _json_scalar(value: object, what: str) -> None:
    """Plan values travel in JSON artifacts: scalars only, finite numbers."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigurationError(f"{what}: {value!r} cannot be stored in a plan")
        return
    raise ConfigurationError(
        f"{what}: {value!r} is not a plan value (use None, bool, int, float or str)"
    )


def check_value(value: object, type_: pa.DataType, what: str) -> object:
    """``value`` as an Arrow scalar of ``type_`` would hold it, else ConfigurationError."""
    try:
        scalar = pa.scalar(value, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise ConfigurationError(f"{what}: {value!r} is not a valid {type_}") from exc
    return scalar.as_py()


@dataclass(frozen=True, slots=True)
class KeyDef:
    """A column: id, Arrow type, nullable, and (non-nullable keys only) an optional default."""

    id: str
    type: pa.DataType
    nullable: bool = False
    default: Any = _NO_DEFAULT

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT


@dataclass(frozen=True, slots=True)
class ParamDef:
    """A named value a plan, a fragment, a request or the registry default supplies."""

    id: str
    type: pa.DataType
    default: Any = _NO_DEFAULT

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT


@dataclass(frozen=True, slots=True)
class P:
    """A task argument read from a param at run time: ``.task("f", stage=pl.P("stage"))``."""

    param: str


# Write effects (evaluated at link time to exact / may / unknown) ------------------------------


class Effect:
    """Base of the declarative write effects."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class FromParam(Effect):
    """Writes the key(s) a param names (a key id or a list of them)."""

    param: str


@dataclass(frozen=True, slots=True)
class Switch(Effect):
    """Writes ``cases[value of param]``."""

    param: str
    cases: Mapping[Any, Sequence[str]]


@dataclass(frozen=True, slots=True, init=False)
class Union(Effect):
    """Writes what every part writes."""

    parts: tuple[Effect | tuple[str, ...], ...]

    def __init__(self, *parts: Effect | Sequence[str]) -> None:
        object.__setattr__(
            self, "parts", tuple(p if isinstance(p, Effect) else tuple(p) for p in parts)
        )


@dataclass(frozen=True, slots=True)
class Unknown(Effect):
    """Writes something no one can say before it runs (never allowed inside a wrapper)."""


@dataclass(frozen=True, slots=True)
class Writes:
    """An evaluated effect: ``kind`` is ``exact``, ``may`` (``keys`` is an upper bound, or None
    when even that is unknown) or ``unknown``."""

    kind: Literal["exact", "may", "unknown"]
    keys: frozenset[str] | None


def evaluate(effect: Effect | tuple[str, ...], known: Mapping[str, Any]) -> Writes:
    """Evaluate a write effect with the params whose values are known (link-time constants)."""
    if isinstance(effect, tuple):
        return Writes("exact", frozenset(effect))
    if isinstance(effect, FromParam):
        if effect.param in known:
            value = known[effect.param]
            named: list[str] = [value] if isinstance(value, str) else list(value or ())
            return Writes("exact", frozenset(named))
        return Writes("may", None)
    if isinstance(effect, Switch):
        if effect.param in known:
            value = known[effect.param]
            if value not in effect.cases:
                return Writes("exact", frozenset())
            return Writes("exact", frozenset(effect.cases[value]))
        bound: set[str] = set()
        for keys in effect.cases.values():
            bound.update(keys)
        return Writes("may", frozenset(bound))
    if isinstance(effect, Union):
        parts = [evaluate(p, known) for p in effect.parts]
        if any(p.kind == "unknown" for p in parts):
            return Writes("unknown", None)
        union: set[str] = set()
        for p in parts:
            if p.keys is None:
                return Writes("may", None)
            union |= p.keys
        kind: Literal["exact", "may"] = "exact" if all(p.kind == "exact" for p in parts) else "may"
        return Writes(kind, frozenset(union))
    return Writes("unknown", None)


def effect_params(effect: Effect | tuple[str, ...]) -> set[str]:
    if isinstance(effect, FromParam | Switch):
        return {effect.param}
    if isinstance(effect, Union):
        out: set[str] = set()
        for p in effect.parts:
            out |= effect_params(p)
        return out
    return set()


def effect_keys(effect: Effect | tuple[str, ...]) -> set[str]:
    """Every key id an effect can name (for reference checks)."""
    if isinstance(effect, tuple):
        return set(effect)
    if isinstance(effect, Switch):
        out: set[str] = set()
        for keys in effect.cases.values():
            out.update(keys)
        return out
    if isinstance(effect, Union):
        acc: set[str] = set()
        for p in effect.parts:
            acc |= effect_keys(p)
        return acc
    return set()


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A registered task: its function and spec (reads, the writes effect, the rowset effect,
    an optional per-task timeout in seconds)."""

    name: str
    fn: Callable[..., Any]
    is_async: bool
    reads: tuple[str, ...]
    writes: Effect | tuple[str, ...]
    rowset: Rowset = "preserve"
    timeout: float | None = None


class Catalog:
    """Keys, params and tasks one engine (or one compiler run) knows about.

    A catalog is an ordinary object: engines and plans share one only when they are given the
    same one. (It was called ``Registry``, a name :class:`timebound.deferred.Registry` also has.)
    """

    def __init__(self) -> None:
        self.keys: dict[str, KeyDef] = {}
        self.params: dict[str, ParamDef] = {}
        self.tasks: dict[str, TaskSpec] = {}

    def key(
        self,
        id: str,
        type: pa.DataType,
        *,
        nullable: bool = False,
        default: Any = _NO_DEFAULT,
    ) -> KeyDef:
        """Register a key (a column). Only a non-nullable key may carry a ``default``."""
        _check_id("key", id)
        if id in self.keys:
            raise ConfigurationError(f"key {id!r} is already registered", option="id")
        if not isinstance(type, pa.DataType):
            raise ConfigurationError(f"key {id!r}: type must be a pyarrow DataType, got {type!r}")
        if default is not _NO_DEFAULT:
            if nullable:
                raise ConfigurationError(
                    f"key {id!r} is nullable: its fill value is null, it takes no default",
                    option="default",
                )
            if default is None:
                raise ConfigurationError(f"key {id!r}: a default cannot be None", option="default")
            _json_scalar(default, f"key {id!r} default")
            check_value(default, type, f"key {id!r} default")
        kd = KeyDef(id, type, bool(nullable), default)
        self.keys[id] = kd
        return kd

    def param(self, id: str, type: pa.DataType, *, default: Any = _NO_DEFAULT) -> ParamDef:
        """Register a param; its ``default`` is the value of origin ``default``."""
        _check_id("param", id)
        if id in self.params:
            raise ConfigurationError(f"param {id!r} is already registered", option="id")
        if not isinstance(type, pa.DataType):
            raise ConfigurationError(f"param {id!r}: type must be a pyarrow DataType, got {type!r}")
        if default is not _NO_DEFAULT:
            _json_scalar(default, f"param {id!r} default")
            check_value(default, type, f"param {id!r} default")
        pd = ParamDef(id, type, default)
        self.params[id] = pd
        return pd

    def task(
        self,
        *,
        reads: Iterable[str] = (),
        writes: Effect | Iterable[str] = (),
        rowset: Rowset = "preserve",
        name: str | None = None,
        timeout: Duration | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(ctx, rows) -> {key_id: column}`` (sync or async) with its TaskSpec.

        ``writes`` is a list of keys (exact) or an effect (:class:`FromParam`, :class:`Switch`,
        :class:`Union`, :class:`Unknown`); ``timeout`` is the task's own budget, a duration
        (``"250ms"``, seconds or a ``timedelta``), kept as seconds in its :class:`TaskSpec`.
        """
        if rowset not in ("preserve", "mutate", "unknown"):
            raise ConfigurationError(
                f"rowset must be 'preserve', 'mutate' or 'unknown', got {rowset!r}",
                option="rowset",
            )
        seconds = None
        if timeout is not None:
            seconds = to_seconds(timeout, option="timeout", allow_zero=False)
            if math.isinf(seconds):
                raise ConfigurationError(
                    "task timeout must be a finite duration (leave it out for no budget of "
                    "its own)",
                    option="timeout",
                )
        read_keys = tuple(reads) if not isinstance(reads, str) else (reads,)
        effect: Effect | tuple[str, ...]
        if isinstance(writes, Effect):
            effect = writes
        elif isinstance(writes, str):
            effect = (writes,)
        else:
            effect = tuple(writes)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            task_name = name if name is not None else getattr(fn, "__name__", None)
            _check_id("task", task_name)
            assert task_name is not None
            if task_name in self.tasks:
                raise ConfigurationError(f"task {task_name!r} is already registered")
            if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
                raise ConfigurationError(
                    f"task {task_name!r} is a generator; a task returns {{key: column}}"
                )
            for k in (*read_keys, *effect_keys(effect)):
                if k not in self.keys:
                    raise ConfigurationError(f"task {task_name!r} names unknown key {k!r}")
            for p in effect_params(effect):
                if p not in self.params:
                    raise ConfigurationError(f"task {task_name!r} names unknown param {p!r}")
            self.tasks[task_name] = TaskSpec(
                task_name,
                fn,
                inspect.iscoroutinefunction(fn),
                read_keys,
                effect,
                rowset,
                seconds,
            )
            return fn

        return decorate


def deprecated_registry(catalog: Catalog, owner: str) -> Catalog:
    """The value of the deprecated ``.registry`` attribute, with its warning."""
    warnings.warn(f"{owner}.registry is now {owner}.catalog", DeprecationWarning, stacklevel=3)
    return catalog


#: ``registry=``, the catalog's keyword before it was renamed (D11.3).
REGISTRY_KEYWORD = Renamed("catalog", hint="a pl.Catalog, which pl.Registry was renamed to")
