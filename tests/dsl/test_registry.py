"""ModuleRegistry: signatures from annotations, clear errors for what cannot be mapped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, TypedDict, Union

import pytest

from timebound import ConfigurationError
from timebound.dsl import ModuleRegistry


class Address(TypedDict):
    city: str


@dataclass
class Person:
    name: str
    address: Address
    tags: list[str]


@dataclass
class Node:
    next: Optional[Node]  # noqa: UP045


def _sig(fn: Any) -> tuple[list[str], str]:
    r = ModuleRegistry()
    r.register("M", fn)
    spec = r.get("M")
    assert spec is not None
    return [str(t) for _, t in spec.params], str(spec.returns)


def test_primitives() -> None:
    """int, str, float, bool map to Int, String, Float, Boolean."""

    def f(a: int, b: str, c: float, d: bool) -> bool:
        return True

    assert _sig(f) == (["Int", "String", "Float", "Boolean"], "Boolean")


def test_containers_and_optionals() -> None:
    """list[T], dict[str, T], Optional[T], T | None and unions."""

    def f(
        a: list[int],
        b: dict[str, list[float]],
        c: Optional[str],  # noqa: UP045
        d: int | None,
        e: Union[int, str],  # noqa: UP007
    ) -> list[dict[str, int]]:
        return []

    assert _sig(f) == (
        [
            "List<Int>",
            "Map<String, List<Float>>",
            "Optional<String>",
            "Optional<Int>",
            "Int | String",
        ],
        "List<Map<String, Int>>",
    )


def test_dataclasses_and_typeddicts_are_records() -> None:
    """Records nest, in field order."""

    def f(p: Person) -> Address:
        return p.address

    assert _sig(f) == (
        ["{ name: String, address: { city: String }, tags: List<String> }"],
        "{ city: String }",
    )


def test_async_functions_are_detected() -> None:
    """An async def is registered as async."""
    r = ModuleRegistry()

    @r.module(name="A.b")
    async def f(x: int) -> int:
        return x

    spec = r.get("A.b")
    assert spec is not None and spec.is_async and spec.name == "A.b"
    assert "A.b" in r and len(r) == 1 and r.names() == ["A.b"]


def test_decorator_returns_the_function() -> None:
    """@registry.module leaves the function callable as before."""
    r = ModuleRegistry()

    @r.module
    def g(x: int) -> int:
        return x + 1

    assert g(1) == 2 and "g" in r


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            lambda x: x,
            "parameter 'x' has an annotation Constellation cannot map: unsupported "
            "annotation (missing)",
        ),
        (
            None,
            "parameter 'x' has an annotation Constellation cannot map: unsupported annotation Any",
        ),
        (
            1,
            "parameter 'x' has an annotation Constellation cannot map: dict keys must be str, "
            "got int",
        ),
        (2, "return annotation cannot be mapped: unsupported annotation (missing)"),
        (3, "parameter 'n' has an annotation Constellation cannot map: recursive record type Node"),
        (4, "parameter 'args' must be positional"),
    ],
)
def test_unmappable_annotations_name_function_and_parameter(fn: Any, message: str) -> None:
    """The error names the module, the function and the parameter."""

    def any_param(x: Any) -> int:
        return 0

    def int_keys(x: dict[int, int]) -> int:
        return 0

    def no_return(x: int):  # type: ignore[no-untyped-def]
        return 0

    def recursive(n: Node) -> int:
        return 0

    def varargs(*args: int) -> int:
        return 0

    fn = {None: any_param, 1: int_keys, 2: no_return, 3: recursive, 4: varargs}.get(fn, fn)
    r = ModuleRegistry()
    with pytest.raises(ConfigurationError) as info:
        r.register("M", fn)
    assert str(info.value).startswith("module 'M' (")
    assert str(info.value).endswith(message)


def test_duplicate_and_invalid_names() -> None:
    """A name is registered once and must be dotted identifiers."""
    r = ModuleRegistry()

    def f(x: int) -> int:
        return x

    r.register("F", f)
    with pytest.raises(ConfigurationError, match="already registered"):
        r.register("F", f)
    for bad in ("", "a..b", "1a", "a-", "-a", "a--b", "a b"):
        with pytest.raises(ConfigurationError, match="invalid module name"):
            r.register(bad, f)


def test_keyword_only_parameters_with_defaults_are_ignored() -> None:
    """Keyword-only parameters with defaults are not part of the Constellation signature."""

    def f(x: int, *, verbose: bool = False) -> int:
        return x

    assert _sig(f) == (["Int"], "Int")
