"""The typed intermediate representation (``Program.ir``): what the checker decided about each
module call, the identity the trace reads, and the policy built from a node alone."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from timebound.dsl import BOOLEAN, STRING, CallOptions, ModuleRegistry, compile
from timebound.dsl._options import OPTIONS
from timebound.dsl._types import ResultType
from timebound.policies import Policy
from timebound.policies._options import BACKOFFS, ON_ERROR_MODES
from timebound.testing import VirtualClock


def _registry() -> ModuleRegistry:
    r = ModuleRegistry()

    @r.module
    def Fetch(key: str) -> str:
        return key.upper()

    @r.module
    def Size(text: str) -> int:
        return len(text)

    return r


PROGRAM = """
in key: String
in fast: Boolean
page = Fetch(key) with timeout: 2s, retry: 3, delay: 100ms, backoff: linear, throttle: 5/1s
later = Fetch(key) with lazy, priority: high
n = if (fast) Size(page) else Size(later)
out n
"""


def test_calls_in_source_order_with_their_placement() -> None:
    """Each module call is one node, in source order, placed as a node, a thunk or inline."""
    ir = compile(PROGRAM, modules=_registry()).ir
    assert [(c.key, c.module, c.placement) for c in ir.calls] == [
        ("page", "Fetch", "node"),
        ("later", "Fetch", "thunk"),
        ("n%1", "Size", "inline"),
        ("n%2", "Size", "inline"),
    ]


def test_node_records_checked_types_position_and_deps() -> None:
    """A node keeps its argument and result types, where it is written and what it reads."""
    ir = compile(PROGRAM, modules=_registry()).ir
    size = ir.call("n%1")
    assert (str(size.params[0]), str(size.returns)) == ("String", "Int")
    assert (size.site.line, size.site.column) == (6, 15)
    assert size.deps == ("page",)
    assert dict(ir.inputs) == {"key": STRING, "fast": BOOLEAN}
    assert list(ir.outputs) == ["n"]


def test_options_are_typed_values() -> None:
    """Durations are seconds, the rate is (count, per, text), levels are numbers."""
    ir = compile(PROGRAM, modules=_registry()).ir
    assert ir.call("page").options == CallOptions(
        declared=frozenset({"timeout", "retry", "delay", "backoff", "throttle"}),
        timeout=2.0,
        retry=3,
        delay=0.1,
        backoff="linear",
        throttle=(5, 1.0, "5/1s"),
    )
    later = ir.call("later").options
    assert (later.lazy, later.priority, later.declared) == (True, 80, {"lazy", "priority"})


def test_wrap_makes_the_node_return_a_result() -> None:
    """Under `on_error: wrap` the node's value type is Result<T>."""
    source = "in k: String\nr = Fetch(k) with on_error: wrap\nout r"
    (node,) = compile(source, modules=_registry()).ir.calls
    assert node.returns == ResultType(STRING)


def test_keys_survive_unrelated_edits() -> None:
    """Adding a declaration before a call leaves the identities of the other calls unchanged."""
    edited = PROGRAM.replace("in fast: Boolean\n", "in fast: Boolean\nextra = Size(key)\n")
    before = {c.key: c.module for c in compile(PROGRAM, modules=_registry()).ir.calls}
    after = {c.key: c.module for c in compile(edited, modules=_registry()).ir.calls}
    assert after == {**before, "extra": "Size"}


def test_trace_records_name_their_ir_node() -> None:
    """Every trace record's node is a call of the IR at the position the record reports."""
    program = compile(PROGRAM, modules=_registry())
    clock = VirtualClock()
    with clock:
        result = clock.run(program.run_traced({"key": "ab", "fast": False}))
    assert result.outputs == {"n": 2}
    seen = []
    for record in result.trace:
        assert record.node is not None
        node = program.ir.call(record.node)
        assert (record.module, record.line, record.column) == (
            node.module,
            node.site.line,
            node.site.column,
        )
        assert (record.lazy, record.priority) == (node.placement == "thunk", node.options.priority)
        seen.append(record.node)
    assert sorted(seen) == ["later", "n%2", "page"]


def test_unknown_key_is_a_key_error() -> None:
    """Looking up an identity the program does not have raises KeyError naming it."""
    ir = compile(PROGRAM, modules=_registry()).ir
    with pytest.raises(KeyError, match="nowhere"):
        ir.call("nowhere")


def test_call_without_options_has_default_options() -> None:
    """A plain call declares nothing and gets no policy: it is called directly."""
    (node,) = compile("in k: String\nv = Size(k)\nout v", modules=_registry()).ir.calls
    assert node.options == CallOptions()
    assert node.placement == "node"


def test_call_options_has_a_field_per_option_of_the_table() -> None:
    """The IR's typed options and the one option table name the same options."""
    fields = {f.name for f in dataclasses.fields(CallOptions)} - {"declared"}
    assert fields == set(OPTIONS)


def test_every_policy_option_of_the_table_is_a_policy_keyword() -> None:
    """Each option the table hands to Policy is a keyword Policy takes, under the same name."""
    parameters = inspect.signature(Policy.__init__).parameters
    to_policy = {name for name, spec in OPTIONS.items() if spec.policy is not None}
    assert to_policy <= set(parameters)
    assert {"fallback", "throttle", "concurrency"} <= set(parameters)  # added by the lowering


def test_option_value_lists_are_the_policies_own() -> None:
    """backoff and on_error accept exactly the values timebound.policies accepts."""
    assert OPTIONS["backoff"].choices == BACKOFFS
    assert OPTIONS["on_error"].choices == ON_ERROR_MODES
