"""``ModuleRegistry``: the Python functions a Constellation program may call.

A module's Constellation signature comes from the function's annotations, mapped once when it
is registered: ``int``->Int, ``str``->String, ``float``->Float, ``bool``->Boolean, ``list[T]``,
``Sequence[T]``->Seq<T> (``Candidates<T>``; a list at run time), ``dict[str, T]``,
``Optional[T]``/``T | None``, unions, dataclasses and TypedDicts -> records.
Records are dicts at run time; a parameter annotated with a dataclass (also inside ``list``,
``dict`` and ``Optional``) receives instances built from the dicts, and dataclasses in a result
are turned back into dicts.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .._core._errors import ConfigurationError
from ._types import (
    BOOLEAN,
    FLOAT,
    INT,
    STRING,
    ListType,
    MapType,
    OptionalType,
    RecordType,
    SeqType,
    Type,
    union_of,
)

if TYPE_CHECKING:
    from ..policies import CircuitBreaker, RetryBudget

__all__ = ["ModuleRegistry", "ModuleSpec"]

_F = TypeVar("_F", bound=Callable[..., Any])

_PRIMS: dict[Any, Type] = {int: INT, str: STRING, float: FLOAT, bool: BOOLEAN}


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    """One registered module: its name, function, Constellation signature and converters."""

    name: str
    fn: Callable[..., Any]
    params: tuple[tuple[str, Type], ...]
    returns: Type
    is_async: bool
    # Per parameter: a function turning a record dict into the dataclass the function expects,
    # or None when the value passes unchanged (the common, free case).
    arg_converters: tuple[Callable[[Any], Any] | None, ...]
    result_converter: Callable[[Any], Any] | None
    # D3.16: the dependency's own breaker and retry budget, given by the host that registered
    # it; every call site of the module runs under them.
    breaker: CircuitBreaker | None = None
    retry_budget: RetryBudget | None = None

    @property
    def arity(self) -> int:
        return len(self.params)


class _MappingError(Exception):
    pass


def _map_annotation(ann: Any, seen: tuple[Any, ...]) -> Type:
    if ann in _PRIMS:
        return _PRIMS[ann]
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is list and len(args) == 1:
        return ListType(_map_annotation(args[0], seen))
    if origin is Sequence and len(args) == 1:
        # D3.16a: collections.abc.Sequence[T] and typing.Sequence[T]: what a Seq<T> / Candidates<T>
        # value is to the function (a list at run time).
        return SeqType(_map_annotation(args[0], seen))
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise _MappingError(f"dict keys must be str, got {_name(args[0])}")
        return MapType(STRING, _map_annotation(args[1], seen))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        inner = union_of([_map_annotation(a, seen) for a in members])
        return OptionalType(inner) if len(members) < len(args) else inner
    if isinstance(ann, type) and (dataclasses.is_dataclass(ann) or typing.is_typeddict(ann)):
        if ann in seen:
            raise _MappingError(f"recursive record type {ann.__name__}")
        try:
            hints = typing.get_type_hints(ann)
        except Exception as exc:
            raise _MappingError(f"cannot resolve the annotations of {ann.__name__}: {exc}")
        if dataclasses.is_dataclass(ann):
            names = [f.name for f in dataclasses.fields(ann)]
        else:
            names = list(hints)
        return RecordType(tuple((n, _map_annotation(hints[n], (*seen, ann))) for n in names))
    raise _MappingError(f"unsupported annotation {_name(ann)}")


def _name(ann: Any) -> str:
    if ann is inspect.Parameter.empty:
        return "(missing)"
    return getattr(ann, "__name__", None) or repr(ann)


def _to_python(ann: Any) -> Callable[[Any], Any] | None:
    """A function turning a run value of annotation ``ann`` into what the function expects:
    record dicts into dataclass instances, also inside lists, dicts and optionals. None when
    ``ann`` holds no dataclass (the value passes unchanged: the common, free case)."""
    if isinstance(ann, type) and dataclasses.is_dataclass(ann):
        return _to_dataclass(ann)
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin in (list, Sequence) and args:
        item = _to_python(args[0])
        return None if item is None else lambda v: [item(x) for x in v]
    if origin is dict and len(args) == 2:
        value = _to_python(args[1])
        return None if value is None else lambda v: {k: value(x) for k, x in v.items()}
    if origin in (typing.Union, types.UnionType):
        # Optional[Dataclass] (the one member that is a record); none passes unchanged.
        convs = [c for a in args if a is not type(None) and (c := _to_python(a)) is not None]
        if len(convs) == 1:
            conv = convs[0]
            return lambda v: conv(v) if isinstance(v, dict) else v
    return None


def _to_dataclass(cls: Any) -> Callable[[Any], Any]:
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    nested = {n: c for n in fields if (c := _to_python(hints[n])) is not None}
    names = frozenset(fields)

    def convert(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        # Width subtyping: a record may carry more fields than the dataclass has; drop them.
        kwargs = {k: (nested[k](v) if k in nested else v) for k, v in value.items() if k in names}
        return cls(**kwargs)

    return convert


def _has_dataclass(ann: Any) -> bool:
    if isinstance(ann, type) and dataclasses.is_dataclass(ann):
        return True
    return any(_has_dataclass(a) for a in typing.get_args(ann))


def _from_python(value: Any) -> Any:
    """A module's result with dataclass instances (at any depth) turned into record dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple):
        return [_from_python(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_python(v) for k, v in value.items()}
    return value


def _build_spec(name: str, fn: Callable[..., Any]) -> ModuleSpec:
    fname = getattr(fn, "__qualname__", repr(fn))
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigurationError(
            f"module {name!r} ({fname}): cannot read its annotations: {exc}", option=name
        ) from exc
    params: list[tuple[str, Type]] = []
    converters: list[Callable[[Any], Any] | None] = []
    for pname, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            if p.kind == p.KEYWORD_ONLY and p.default is not p.empty:
                continue  # keyword-only with a default: not part of the Constellation signature
            raise ConfigurationError(
                f"module {name!r} ({fname}): parameter {pname!r} must be positional", option=name
            )
        ann = hints.get(pname, inspect.Parameter.empty)
        try:
            params.append((pname, _map_annotation(ann, ())))
        except _MappingError as exc:
            raise ConfigurationError(
                f"module {name!r} ({fname}): parameter {pname!r} has an annotation Constellation "
                f"cannot map: {exc}",
                option=name,
            ) from None
        converters.append(_to_python(ann))
    ret = hints.get("return", inspect.Parameter.empty)
    try:
        returns = _map_annotation(ret, ())
    except _MappingError as exc:
        raise ConfigurationError(
            f"module {name!r} ({fname}): return annotation cannot be mapped: {exc}", option=name
        ) from None
    result_converter = _from_python if _has_dataclass(ret) else None
    return ModuleSpec(
        name=name,
        fn=fn,
        params=tuple(params),
        returns=returns,
        is_async=inspect.iscoroutinefunction(fn),
        arg_converters=tuple(converters),
        result_converter=result_converter,
    )


# A name part is what the lexer reads as one identifier: hyphens join word characters
# (`string-length`, `ide-ranker-v2`).
_NAME_PART = re.compile(r"[^\W\d]\w*(?:-\w+)*")


def _check_name(name: str) -> None:
    if not all(_NAME_PART.fullmatch(p) for p in name.split(".")):
        raise ConfigurationError(
            f"invalid module name {name!r}: use identifiers separated by dots", option="name"
        )


class ModuleRegistry:
    """The modules a program may call, by (case-sensitive, possibly qualified) name.

    ``@registry.module`` registers a function under its own name, ``@registry.module(name="X")``
    under ``X``, and ``registry.register("X", fn)`` does the same without a decorator. Sync and
    async functions are accepted; the signature comes from the annotations and a function whose
    annotations cannot be mapped raises :class:`~timebound.ConfigurationError` naming the
    function and the parameter.
    """

    def __init__(self) -> None:
        self._modules: dict[str, ModuleSpec] = {}
        self._cache_backends: dict[str, Any] = {}

    @overload
    def module(self, fn: _F, /) -> _F: ...

    @overload
    def module(
        self,
        *,
        name: str | None = None,
        breaker: CircuitBreaker | None = None,
        retry_budget: RetryBudget | None = None,
    ) -> Callable[[_F], _F]: ...

    def module(  # type: ignore[misc]
        self,
        fn: _F | None = None,
        /,
        *,
        name: str | None = None,
        breaker: CircuitBreaker | None = None,
        retry_budget: RetryBudget | None = None,
    ) -> _F | Callable[[_F], _F]:
        """Decorator registering a function as a module (optionally under ``name``, with the
        dependency's ``breaker`` and ``retry_budget``: see :meth:`register`)."""

        def decorate(f: _F) -> _F:
            self.register(name or f.__name__, f, breaker=breaker, retry_budget=retry_budget)
            return f

        if fn is not None:
            return decorate(fn)
        return decorate

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        breaker: CircuitBreaker | None = None,
        retry_budget: RetryBudget | None = None,
    ) -> None:
        """Register ``fn`` as module ``name``; a name may be registered once.

        ``breaker`` (a :class:`~timebound.policies.CircuitBreaker`) and ``retry_budget`` (a
        :class:`~timebound.policies.RetryBudget`) belong to the dependency the module stands
        for (D3.16): every call of the module, at every call site of every program compiled
        against this registry, runs under them, with or without options of its own. The objects
        are shared by being passed here, never by a name; pass the same object to another
        module or a Python policy to share it further.
        """
        from ..policies._options import check_breaker, check_retry_budget

        _check_name(name)
        if name in self._modules:
            raise ConfigurationError(f"module {name!r} is already registered", option="name")
        breaker = check_breaker(breaker)
        retry_budget = check_retry_budget(retry_budget)
        spec = _build_spec(name, fn)
        if breaker is not None or retry_budget is not None:
            spec = dataclasses.replace(spec, breaker=breaker, retry_budget=retry_budget)
        self._modules[name] = spec

    def register_cache_backend(self, name: str, backend: Any) -> None:
        """Make ``backend`` the cache of every program compiled against this registry that says
        ``cache_backend: "name"`` (D3.6). Registered on purpose, here only: nothing is shared
        through a process-wide name. ``"memory"`` is built in (a cache of the program's own)."""
        from ..policies import CacheBackend

        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                "a cache backend name must be a non-empty string", option="name"
            )
        if name == "memory":
            raise ConfigurationError(
                "'memory' is the built-in cache backend and cannot be replaced", option="name"
            )
        if name in self._cache_backends:
            raise ConfigurationError(f"cache backend {name!r} is already registered", option="name")
        if not isinstance(backend, CacheBackend):
            raise ConfigurationError(
                f"cache backend {name!r} must have get(key) and set(key, value, ttl) methods",
                option="cache_backend",
            )
        self._cache_backends[name] = backend

    def cache_backend(self, name: str) -> Any:
        """The backend registered as ``name`` (not ``"memory"``), or None."""
        return self._cache_backends.get(name)

    def cache_backend_names(self) -> list[str]:
        """``"memory"`` and every registered backend name, sorted."""
        return sorted({"memory", *self._cache_backends})

    def get(self, name: str) -> ModuleSpec | None:
        """The module registered as ``name``, or None."""
        return self._modules.get(name)

    def names(self) -> list[str]:
        """Every registered module name, sorted."""
        return sorted(self._modules)

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)
