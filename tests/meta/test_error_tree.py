"""One error tree (D2.1, D2.6): every public exception derives from TimeboundError, and every
"your input is invalid" error from InvalidInput, keeping its builtin base, code and field path.

The public packages are found by walking the source tree, not listed: a package added later is
covered as soon as it exists.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import warnings
from typing import Any

import pytest

import timebound

# Optional extras that may be missing here: their modules are skipped, not failed.
_EXTRAS = {"grpc", "httpx", "requests", "aiohttp", "asyncpg", "psycopg", "redis", "opentelemetry"}


def _public_modules() -> list[str]:
    names = ["timebound"]
    for info in pkgutil.walk_packages(timebound.__path__, "timebound."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return names


def _exceptions() -> list[tuple[str, type[BaseException]]]:
    found: dict[type[BaseException], str] = {}
    for name in _public_modules():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = importlib.import_module(name)
        except ImportError as exc:
            if exc.name and exc.name.split(".")[0] in _EXTRAS:
                continue
            raise
        for attr in getattr(module, "__all__", ()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # an old path's names
                value = getattr(module, attr)
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and not issubclass(value, Warning)  # warnings are not errors
            ):
                found.setdefault(value, f"{name}.{attr}")
    return sorted(((where, cls) for cls, where in found.items()), key=lambda p: p[0])


EXCEPTIONS = _exceptions()


def test_the_walk_finds_the_packages_exceptions() -> None:
    """The walk sees the exceptions of every engine (a broken walk would pass vacuously)."""
    where = {w.rsplit(".", 1)[0] for w, _ in EXCEPTIONS}
    assert {"timebound", "timebound.workflow", "timebound.deferred", "timebound.pipeline"} <= where
    assert len(EXCEPTIONS) >= 20


@pytest.mark.parametrize(("where", "cls"), EXCEPTIONS, ids=[w for w, _ in EXCEPTIONS])
def test_every_public_exception_derives_from_timebound_error(
    where: str, cls: type[BaseException]
) -> None:
    """Every exception class a public package exports is a TimeboundError with a string code."""
    assert issubclass(cls, timebound.TimeboundError), f"{where}: {cls.__mro__}"
    assert isinstance(cls.code, str) and cls.code, where  # type: ignore[attr-defined]


def _invalid_inputs() -> list[tuple[str, Any, str, str | None]]:
    """(name, error, its stable code, the field path it names) for each input error kind."""
    from timebound.deferred import SchemaError
    from timebound.dsl import CompileError, InputError, compile
    from timebound.host import ConfigError
    from timebound.pipeline import ValidationError
    from timebound.workflow import DefinitionError, parse_definition

    def raised(fn: Any, *args: Any, **kwargs: Any) -> BaseException:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            return exc
        raise AssertionError(f"{fn} did not raise")

    compile_error = raised(compile, "out nope\n")
    assert isinstance(compile_error, CompileError)
    definition_error = raised(
        parse_definition, {"id": "x", "initial_node": "A", "nodes": [{"id": "A"}]}
    )
    assert isinstance(definition_error, DefinitionError)
    return [
        (
            "ConfigurationError",
            raised(timebound.fail_after, "soon"),
            "configuration-error",
            "seconds",
        ),
        ("DefinitionError", definition_error, "workflow-definition-error", definition_error.path),
        (
            "ValidationError",
            ValidationError("schema", "bad", node_id="n1"),
            "pipeline-validation",
            "n1",
        ),
        ("CompileError", compile_error, "constellation-compile-error", "1:5"),
        ("InputError", InputError("no input 'x'", input="x"), "constellation-input-error", "x"),
        (
            "SchemaError",
            SchemaError("deferred-operation.v1", "$.id", "type", "not a string"),
            "deferred-schema-error",
            "$.id",
        ),
        (
            "ConfigError",
            ConfigError("port: not a number", option="port"),
            "host-config-error",
            "port",
        ),
    ]


@pytest.mark.parametrize("case", range(7))
def test_every_input_error_is_an_invalid_input(case: int) -> None:
    """`except timebound.InvalidInput` catches each input error; it is still a ValueError, keeps
    its code, names its field, and pickles as itself."""
    name, err, code, field = _invalid_inputs()[case]
    assert isinstance(err, timebound.InvalidInput), name
    assert isinstance(err, ValueError) and isinstance(err, timebound.TimeboundError), name
    assert err.code == code, name
    assert err.field == field, name
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err) and str(copy) == str(err) and copy.field == field, name


def test_store_busy_is_importable_from_the_workflow_package() -> None:
    """StoreBusy (a second process opening a SQLite store) is catchable by public name."""
    from timebound.workflow import StoreBusy, StoreError

    assert issubclass(StoreBusy, StoreError)
    assert issubclass(StoreBusy, timebound.TimeboundError) and issubclass(StoreBusy, RuntimeError)
    assert StoreBusy.code == "store-busy"


def test_deferred_errors_with_their_own_arguments_pickle() -> None:
    """The deferred errors whose constructors take more than a message pickle as themselves."""
    from timebound.deferred import ContinuationRefused, Overloaded, TransientPollError

    for err in (
        TransientPollError("poll-5xx", "the connector answered 503"),
        Overloaded("no more work now", 5),
        ContinuationRefused("continuation-tampered"),
    ):
        copy = pickle.loads(pickle.dumps(err))
        assert (type(copy), str(copy), copy.code) == (type(err), str(err), err.code)
    assert pickle.loads(pickle.dumps(Overloaded("x", 7))).retry_after_s == 7
