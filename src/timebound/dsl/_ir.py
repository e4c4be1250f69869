"""The typed intermediate representation of a checked program: what the type checker decides,
before anything runs.

The checker produces one :class:`CallNode` per module call: where it is written, its stable
identity, the argument and result types it checked, its options as typed values (read through
the one option table, ``_options.OPTIONS``) and where the call runs (a DAG node of its own, a lazy
thunk, or in place inside a conditional expression). Lowering (``_compiler.py``) then builds the
runnable parts from a node: the call site's :class:`~timebound.policies.Policy` and its compiled
call, whose trace records (:class:`~timebound.dsl.CallTrace`, what ``timebound run
--trace`` prints) carry the node's identity, module, position, laziness and priority.
``Program.ir`` keeps the representation for tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _ast as A
from ._runtime import CallSite
from ._types import Type

__all__ = ["CallNode", "CallOptions", "ProgramIR"]

Placement = Literal["node", "thunk", "inline"]


@dataclass(frozen=True, slots=True)
class CallOptions:
    """A call's ``with`` options as checked values; ``declared`` names the ones written.

    Durations are seconds; ``throttle`` is ``(count, per seconds, text as written)``; ``hedge``
    is seconds or a percentile's text (``"p95"``);
    ``fallback`` says whether one is declared (its expression is compiled with the call).
    """

    declared: frozenset[str] = frozenset()
    retry: int = 0
    timeout: float | None = None
    delay: float | None = None
    backoff: str | None = None
    cache: float | None = None
    cache_backend: str | None = None
    throttle: tuple[int, float, str] | None = None
    concurrency: int | None = None
    hedge: float | str | None = None
    on_error: str = "propagate"
    reserve: float | None = None
    lazy: bool = False
    priority: int = 50
    fallback: bool = False

    @classmethod
    def of(cls, options: Mapping[str, A.Option]) -> CallOptions:
        """The options of a parsed call (the parser has checked each value's form)."""
        values: dict[str, Any] = {
            name: opt.value for name, opt in options.items() if name != "fallback"
        }
        if "priority" in values:
            values["priority"] = int(values["priority"])
        if "lazy" in values:
            values["lazy"] = bool(values["lazy"])
        return cls(declared=frozenset(options), fallback="fallback" in options, **values)


@dataclass(frozen=True, slots=True)
class CallNode:
    """One module call of the program, type-checked.

    ``key`` is its identity, stable across edits of other declarations: the binding's name for
    ``y = F(x)``, else the declaration's name and the call's place in it. ``params`` are the
    argument types as checked, ``returns`` the call's value type (``Result<T>`` under
    ``on_error: wrap``). ``deps`` are the keys of the values it reads (the fallback's too).
    ``positions`` say where each option's value is written, for diagnostics while lowering.
    """

    key: str
    module: str
    site: CallSite
    params: tuple[Type, ...]
    returns: Type
    options: CallOptions
    deps: tuple[str, ...]
    placement: Placement
    positions: Mapping[str, A.Pos] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProgramIR:
    """A checked program: its typed inputs and outputs and its module calls in source order."""

    inputs: Mapping[str, Type]
    outputs: Mapping[str, Type]
    calls: tuple[CallNode, ...]

    def call(self, key: str) -> CallNode:
        """The call whose identity is ``key`` (a trace record's ``node``)."""
        for node in self.calls:
            if node.key == key:
                return node
        raise KeyError(key)
