"""Host modules taking Seq<T>/Candidates<T> (Sequence[T]), and repeated or computed @example."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from timebound.dsl import CompileError, ModuleRegistry, compile
from timebound.dsl._types import INT, SeqType
from timebound.testing import VirtualClock


@dataclass
class Item:
    id: int
    score: float


def _registry() -> ModuleRegistry:
    registry = ModuleRegistry()

    @registry.module
    def Top(items: Sequence[Item], n: int) -> list[Item]:
        assert all(isinstance(i, Item) for i in items)  # records arrive as dataclasses
        return sorted(items, key=lambda i: -i.score)[:n]

    @registry.module
    def Count(xs: typing.Sequence[int]) -> int:
        return len(xs)

    return registry


def test_sequence_annotations_map_to_seq() -> None:
    """collections.abc.Sequence[T] and typing.Sequence[T] are Seq<T>."""
    spec = _registry().get("Count")
    assert spec is not None and spec.params == (("xs", SeqType(INT)),)


async def test_a_candidates_input_reaches_a_host_module(virtual_clock: VirtualClock) -> None:
    """Candidates<Item> and Seq<Int> inputs are passed to Sequence-annotated modules."""
    source = (
        "type Item = { id: Int, score: Float }\nin items: Candidates<Item>\nin xs: Seq<Int>\n"
        "t = Top(items, 1)\nc = Count(xs)\nout t\nout c"
    )
    program = compile(source, modules=_registry())
    items = [{"id": 1, "score": 0.5}, {"id": 2, "score": 0.9}]
    assert await program.run({"items": items, "xs": [1, 2, 3]}) == {
        "t": [{"id": 2, "score": 0.9}],
        "c": 3,
    }


def test_a_list_is_a_seq_argument() -> None:
    """A List<Int> input may be passed where the module takes a Seq<Int>."""
    compile("in xs: List<Int>\nc = Count(xs)\nout c", modules=_registry())


def test_repeated_examples_are_kept_and_the_first_is_the_example() -> None:
    """Two @example annotations: both in the annotations, the first is the input's example."""
    program = compile("@example(3)\n@example(5)\nin n: Int\nout n", modules=ModuleRegistry())
    assert program.examples == {"n": 3}
    assert [a.values for a in program.annotations["n"]] == [(3,), (5,)]


def test_an_example_may_be_a_constant_expression() -> None:
    """@example(60 * 1000) is computed at compile time."""
    program = compile("@example(60 * 1000)\nin n: Int\nout n", modules=ModuleRegistry())
    assert program.examples == {"n": 60000}


@pytest.mark.parametrize("value", ["a", "Count([1])", "[a, 1]"])
def test_an_example_that_reads_or_calls_is_e020(value: str) -> None:
    """An example that reads a value or calls a module is still E020."""
    with pytest.raises(CompileError) as info:
        compile(f"in a: Int\n@example({value})\nin b: Int\nout b", modules=_registry())
    assert [d.code for d in info.value.diagnostics] == ["E020"]
