"""Running programs: the DAG, concurrency, lazy values, conditionals, failures, the trace."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

import pytest

import timebound
from timebound import DeadlineExceeded
from timebound._core import _clock
from timebound.dsl import CallSite, ModuleRegistry, TracedRun, compile
from timebound.testing import VirtualClock

from ._modules import Log, build, make_registry


async def test_independent_calls_run_concurrently(virtual_clock: VirtualClock) -> None:
    """Two one-second calls that do not depend on each other both end at t=1."""
    program = build("in x: Int\na = Inc(x)\nb = Inc(x)\nout a\nout b")
    assert await program.run({"x": 1}) == {"a": 2, "b": 2}
    assert virtual_clock.now() == 1.0


async def test_dependent_calls_run_in_order(virtual_clock: VirtualClock) -> None:
    """Inc(Inc(x)) takes two seconds: the inner call is its own node, run first."""
    program = build("in x: Int\ny = Inc(Inc(x))\nout y")
    assert await program.run({"x": 1}) == {"y": 3}
    assert virtual_clock.now() == 2.0


async def test_diamond(virtual_clock: VirtualClock) -> None:
    """a -> (b, c) -> d: d starts when both b and c are done."""
    log = Log()
    program = build(
        "in x: Int\na = Inc(x)\nb = Inc(a)\nc = Slow(3)\nd = Inc(b + c)\nout d",
        make_registry(log),
    )
    assert await program.run({"x": 0}) == {"d": 6}
    assert log.starts("Inc") == [0.0, 1.0, 3.0]
    assert virtual_clock.now() == 4.0


async def test_if_runs_only_the_taken_branch(virtual_clock: VirtualClock) -> None:
    """A call in the branch not taken is never made."""
    log = Log()
    program = build("in x: Int\ny = if (x > 0) Inc(x) else Fail(x)\nout y", make_registry(log))
    assert await program.run({"x": 1}) == {"y": 2}
    assert log.names() == ["Inc"]


async def test_coalesce_right_side_is_lazy(virtual_clock: VirtualClock) -> None:
    """x ?? Call(...) calls only when x is none."""
    log = Log()
    program = build("in x: Int\nm = Maybe(x)\ny = m ?? Inc(x)\nout y", make_registry(log))
    assert await program.run({"x": 5}) == {"y": 5}
    assert log.names() == []
    assert await program.run({"x": -1}) == {"y": 0}
    assert log.names() == ["Inc"]


async def test_and_or_short_circuit(virtual_clock: VirtualClock) -> None:
    """The right operand of and/or is evaluated only when needed."""
    log = Log()
    program = build(
        "in b: Boolean\ny = b or Inc(1) > 0\nz = b and Inc(2) > 0\nout y\nout z",
        make_registry(log),
    )
    assert await program.run({"b": True}) == {"y": True, "z": True}
    assert [c[1] for c in log.calls] == [2]


async def test_unneeded_lazy_value_is_never_computed(virtual_clock: VirtualClock) -> None:
    """A lazy call nobody consumes does not run."""
    log = Log()
    program = build("in x: Int\nunused = Inc(x) with lazy\ny = x\nout y", make_registry(log))
    assert await program.run({"x": 1}) == {"y": 1}
    assert log.names() == [] and virtual_clock.now() == 0.0


async def test_lazy_value_is_computed_once(virtual_clock: VirtualClock) -> None:
    """Two consumers of one lazy value share one evaluation."""
    log = Log()
    program = build(
        "in x: Int\nv = Inc(x) with lazy\na = Inc(v)\nb = Inc(v)\nout a\nout b",
        make_registry(log),
    )
    assert await program.run({"x": 1}) == {"a": 3, "b": 3}
    assert [c[1] for c in log.calls].count(1) == 1
    assert virtual_clock.now() == 2.0


async def test_lazy_value_used_only_in_a_branch(virtual_clock: VirtualClock) -> None:
    """A lazy value referenced only in the branch not taken is never computed."""
    log = Log()
    program = build(
        "in x: Int\nv = Fail(x) with lazy\ny = if (x > 0) x else v\nout y", make_registry(log)
    )
    assert await program.run({"x": 1}) == {"y": 1}
    assert log.names() == []


async def test_lazy_false_is_eager(virtual_clock: VirtualClock) -> None:
    """lazy: false behaves as no lazy at all."""
    log = Log()
    program = build("in x: Int\nv = Inc(x) with lazy: false\ny = x\nout y", make_registry(log))
    await program.run({"x": 1})
    assert log.names() == ["Inc"]


async def test_lazy_output_is_computed(virtual_clock: VirtualClock) -> None:
    """An output that is lazy is needed: it is forced."""
    program = build("in x: Int\nv = Inc(x) with lazy\nout v")
    assert await program.run({"x": 1}) == {"v": 2}


async def test_a_failure_cancels_the_other_calls(virtual_clock: VirtualClock) -> None:
    """Fail at t=1 fails the run at t=1 and cancels the call still hanging; nothing leaks."""
    log = Log()
    program = build("in x: Int\na = Hang(x)\nb = Fail(x)\nout a\nout b", make_registry(log))
    with pytest.raises(ValueError, match=r"^Fail\(1\) always fails") as info:
        await program.run({"x": 1})
    assert virtual_clock.now() == 1.0
    assert info.value.call_site == CallSite("Fail", 3, 5)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_a_sync_failure_cancels_a_lazy_call_being_forced(
    virtual_clock: VirtualClock,
) -> None:
    """A sync call failing at t=1 cancels a lazy call two consumers are forcing, and waits for
    its cleanup before the run raises."""
    cleanup: list[float] = []
    registry = make_registry()

    @registry.module
    async def Slowly(x: int) -> int:
        try:
            await asyncio.sleep(100)
        finally:
            await asyncio.sleep(0)
            cleanup.append(_clock.now())
        return x

    @registry.module
    def Boom(x: int) -> int:
        raise ValueError("boom")

    program = build(
        "in x: Int\nl = Slowly(x) with lazy\ne = l + 1\nf = l + 2\nc = Inc(x)\nd = Boom(c)\n"
        "out e\nout f\nout d",
        registry,
    )
    with pytest.raises(ValueError, match=r"^boom"):
        await program.run({"x": 1})
    assert cleanup == [1.0]
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_failure_message_names_the_call_site(virtual_clock: VirtualClock) -> None:
    """The error's message carries line, column and module (D3.10)."""
    program = build("in x: Int\n\n   b = Fail(x)\nout b")
    with pytest.raises(ValueError) as info:
        await program.run({"x": 1})
    assert str(info.value) == "Fail(1) always fails [at line 3, column 8: Fail]"


async def test_run_timeout_is_inherited_by_module_code(virtual_clock: VirtualClock) -> None:
    """Module code sees the run's deadline as its effective deadline (D1.5)."""
    seen: list[float] = []
    registry = ModuleRegistry()

    @registry.module
    async def Look(x: int) -> int:
        seen.append(timebound.remaining())
        return x

    program = compile("y = Look(1)\nout y", modules=registry)
    await program.run({}, timeout=5)
    assert seen == [5.0]


async def test_run_timeout_fails_the_run(virtual_clock: VirtualClock) -> None:
    """A run that outlives its timeout raises DeadlineExceeded at exactly that instant."""
    program = build("in x: Int\ny = Hang(x)\nout y")
    with pytest.raises(DeadlineExceeded) as info:
        await program.run({"x": 1}, timeout="3s")
    assert virtual_clock.now() == 3.0
    assert info.value.source == "scope"
    assert "run timed out after 3s" in str(info.value)


async def test_concurrency_limit(virtual_clock: VirtualClock) -> None:
    """Three one-second calls with concurrency 2 end at t=2."""
    program = build("a = Inc(1)\nb = Inc(2)\nc = Inc(3)\nout a\nout b\nout c")
    await program.run({}, concurrency=2)
    assert virtual_clock.now() == 2.0


async def test_priority_orders_ready_calls(virtual_clock: VirtualClock) -> None:
    """With one slot, ready calls start by priority (critical first, background last)."""
    log = Log()
    program = build(
        "a = Inc(1) with priority: background\nb = Inc(2) with priority: critical\n"
        "c = Inc(3)\nd = Inc(4) with priority: 90\nout a\nout b\nout c\nout d",
        make_registry(log),
    )
    await program.run({}, concurrency=1)
    assert [c[1] for c in log.calls] == [2, 4, 3, 1]
    assert log.starts("Inc") == [0.0, 1.0, 2.0, 3.0]


async def test_bad_concurrency_is_rejected(virtual_clock: VirtualClock) -> None:
    """concurrency must be a positive integer."""
    program = build("y = 1\nout y")
    with pytest.raises(timebound.ConfigurationError):
        await program.run({}, concurrency=0)


async def test_runs_are_independent(virtual_clock: VirtualClock) -> None:
    """Two concurrent runs of one program keep their own values."""
    program = build("in x: Int\ny = Inc(x)\nz = y * 10\nout z")
    a, b = await asyncio.gather(program.run({"x": 1}), program.run({"x": 2}))
    assert (a, b) == ({"z": 20}, {"z": 30})


def test_run_sync() -> None:
    """run_sync runs a program from synchronous code."""
    assert build("in s: String\ny = text.upper(s)\nout y").run_sync({"s": "a"}) == {"y": "A"}


async def test_run_sync_inside_a_loop_is_an_error(virtual_clock: VirtualClock) -> None:
    """run_sync refuses to start a loop inside a running one."""
    with pytest.raises(RuntimeError, match="await run"):
        build("y = 1\nout y").run_sync({})


# Values -----------------------------------------------------------------------------------------


def test_expressions() -> None:
    """Arithmetic, comparison, boolean logic, ??, if/else, lists, records and field access."""
    program = build(
        "in x: Int\nin f: Float\n"
        "a = x * 2 + 1 - 3 / 3\nb = x > 1 and not (x == 3) or false\n"
        'c = Maybe(-1) ?? 7\nd = if (x != 2) "no" else "yes"\n'
        'e = [x, x + 1] + [9]\nr = { n: x, inner: { s: "t" } }\ng = r.inner.s\n'
        'h = f * x\ni = -x\nj = "a" + "b"\nk = x <= 2 and x >= 2 and x < 3\n'
        "out a\nout b\nout c\nout d\nout e\nout g\nout h\nout i\nout j\nout k"
    )
    assert program.run_sync({"x": 2, "f": 1.5}) == {
        "a": 4,
        "b": True,
        "c": 7,
        "d": "yes",
        "e": [2, 3, 9],
        "g": "t",
        "h": 3.0,
        "i": -2,
        "j": "ab",
        "k": True,
    }
    assert {n: str(t) for n, t in program.outputs.items()} == {
        "a": "Int",
        "b": "Boolean",
        "c": "Int",
        "d": "String",
        "e": "List<Int>",
        "g": "String",
        "h": "Float",
        "i": "Int",
        "j": "String",
        "k": "Boolean",
    }


def test_interpolation_renders_values() -> None:
    """${} renders strings as is, booleans as true/false, none, numbers and JSON."""
    program = build(
        'in x: Int\ny = "${x}|${x > 1}|${Maybe(-1)}|${[1, 2]}|${{a: "b"}}|${1.5}|${"s"}"\nout y'
    )
    assert program.run_sync({"x": 2}) == {"y": '2|true|none|[1, 2]|{"a": "b"}|1.5|s'}


def test_escapes_in_strings() -> None:
    """\\n, \\t, \\", \\\\, \\$ and \\u{...} escapes."""
    program = build('y = "a\\n\\t\\"\\\\\\${x}\\u{41}"\nout y')
    assert program.run_sync({}) == {"y": 'a\n\t"\\${x}A'}


def test_division_by_zero_names_the_place() -> None:
    """Dividing by zero fails the run with the expression's position."""
    program = build("in x: Int\ny = 1 / x\nout y")
    with pytest.raises(ZeroDivisionError, match="at line 2, column 7"):
        program.run_sync({"x": 0})


def test_records_from_modules_and_field_access() -> None:
    """A module returning a TypedDict gives a record; fields are typed and readable."""
    program = build('u = GetUser("7")\nn = u.name\ns = u.score + 1\nout n\nout s')
    assert program.run_sync({}) == {"n": "Ada", "s": 18}


def test_record_width_subtyping_for_arguments() -> None:
    """A record with extra fields is accepted where fewer are expected (extras are dropped)."""
    registry = ModuleRegistry()
    seen: list[object] = []

    def Norm1(p: _Pt) -> int:
        seen.append(p)
        return abs(p.x) + abs(p.y)

    registry.register("Norm1", Norm1)
    program = compile('y = Norm1({ x: 3, y: -4, label: "p" })\nout y', modules=registry)
    assert program.run_sync({}) == {"y": 7}
    assert seen == [_Pt(3, -4)]


def test_dataclass_parameters_and_results() -> None:
    """A dataclass parameter receives an instance; a dataclass result becomes a dict."""
    registry = ModuleRegistry()
    registry.register("Flip", _flip)
    program = compile("p = Flip({ x: 1, y: 2 })\nq = p.x\nout p\nout q", modules=registry)
    assert program.run_sync({}) == {"p": {"x": 2, "y": 1}, "q": 2}


@dataclass
class _Pt:
    x: int
    y: int


def _flip(p: _Pt) -> _Pt:
    assert isinstance(p, _Pt)
    return _Pt(p.y, p.x)


@dataclass
class _Line:
    points: list[_Pt]


def test_dataclasses_inside_lists_and_optionals_are_converted() -> None:
    """list[Dataclass], Optional[Dataclass] and dataclass fields holding lists of dataclasses
    are instances inside the module and dicts in the program, as a top-level dataclass is."""
    seen: list[object] = []

    def Longest(lines: list[_Line], extra: Optional[_Pt]) -> Optional[_Line]:  # noqa: UP045
        seen.append((lines, extra))
        return max(lines, key=lambda line: len(line.points), default=None)

    def Points(line: _Line) -> list[_Pt]:
        return line.points

    registry = ModuleRegistry()
    registry.register("Longest", Longest)
    registry.register("Points", Points)
    program = compile(
        "in lines: List<{ points: List<{ x: Int, y: Int }> }>\n"
        "l = Longest(lines, { x: 0, y: 0 }) ?? { points: [] }\n"
        "first = Points(l)\nn = l.points\nout first\nout n",
        modules=registry,
    )
    lines = [{"points": [{"x": 1, "y": 2}]}, {"points": [{"x": 3, "y": 4}, {"x": 5, "y": 6}]}]
    outputs = program.run_sync({"lines": lines})
    assert outputs["first"] == [{"x": 3, "y": 4}, {"x": 5, "y": 6}]
    assert outputs["n"] == outputs["first"]
    assert seen == [([_Line([_Pt(1, 2)]), _Line([_Pt(3, 4), _Pt(5, 6)])], _Pt(0, 0))]


def test_use_declarations() -> None:
    """use a.b makes b.name callable; use ... as alias renames; full names always work."""
    program = build(
        'use text\nuse text.upper\nuse text.upper as shout\na = text.upper("a")\nb = shout("b")\n'
        'c = upper("c")\nout a\nout b\nout c'
    )
    assert program.run_sync({}) == {"a": "A", "b": "B", "c": "C"}


def test_type_aliases_and_unions() -> None:
    """Aliases name types; unions accept any member."""
    program = build(
        "type Id = String | Int\ntype Pair = { a: Id, b: List<Id> }\nin p: Pair\ny = p.a\nout y"
    )
    assert str(program.inputs["p"]) == "{ a: String | Int, b: List<String | Int> }"
    assert program.run_sync({"p": {"a": 1, "b": ["x", 2]}}) == {"y": 1}


def test_collections_through_modules() -> None:
    """list[str] and dict[str, int] map to List<String> and Map<String, Int>."""
    program = build('w = Words("a b a")\nc = Counts(w)\nout c')
    assert program.run_sync({}) == {"c": {"a": 2, "b": 1}}
    assert str(program.outputs["c"]) == "Map<String, Int>"


# Trace --------------------------------------------------------------------------------------------


async def test_trace_records_each_call(virtual_clock: VirtualClock) -> None:
    """run_traced reports module, position, attempts, timeouts, delays, fallback and times."""
    program = build(
        "in x: Int\na = Inc(x)\nb = Hang(a) with timeout: 1s, retry: 1, delay: 500ms, "
        "fallback: 0\nout b"
    )
    result = await program.run_traced({"x": 1})
    assert isinstance(result, TracedRun) and result.outputs == {"b": 0}
    inc, hang = result.trace
    assert (inc.module, inc.line, inc.column, inc.start, inc.end, inc.attempts, inc.outcome) == (
        "Inc",
        2,
        5,
        0.0,
        1.0,
        1,
        "ok",
    )
    assert (hang.module, hang.line, hang.column) == ("Hang", 3, 5)
    assert (hang.start, hang.end, hang.attempts, hang.timeouts) == (1.0, 3.5, 2, 2)
    assert hang.delays == [0.5] and hang.fallback and hang.outcome == "fallback"
    assert [(a.start, a.end, a.outcome) for a in hang.attempt_log] == [
        (1.0, 2.0, "timeout"),
        (2.5, 3.5, "timeout"),
    ]
    assert result.duration == 3.5


async def test_trace_of_a_failed_call(virtual_clock: VirtualClock) -> None:
    """A failing call's record says error and why."""
    program = build("in x: Int\ny = Fail(x)\nout y")
    trace: list[object] = []
    with pytest.raises(ValueError):
        await program._execute({"x": 1}, None, None, True, sink=trace)  # type: ignore[arg-type]
    (rec,) = trace
    assert rec.outcome == "error" and rec.error == "ValueError: Fail(1) always fails"  # type: ignore[attr-defined]


async def test_untraced_runs_record_nothing(virtual_clock: VirtualClock) -> None:
    """run() keeps no trace; a run's clock reads are those of the modules only."""
    program = build("in x: Int\ny = Inc(x)\nout y")
    assert await program.run({"x": 1}) == {"y": 2}
    assert _clock.now() == 1.0


def test_public_names() -> None:
    """timebound.dsl exports exactly its __all__ (nothing leaks, nothing is missing)."""
    import timebound.dsl as dsl

    public = {n for n, v in vars(dsl).items() if not n.startswith("_") and n != "annotations"}
    public = {n for n in public if not isinstance(getattr(dsl, n), type(dsl))}
    assert public == set(dsl.__all__)


def test_trio_callers_get_a_clear_error() -> None:
    """Under trio the runtime says it needs asyncio (run_sync works from sync code)."""
    trio = pytest.importorskip("trio")
    program = build("y = 1\nout y")
    with pytest.raises(RuntimeError, match="asyncio event loop"):
        trio.run(program.run, {})


async def test_calls_inside_an_unneeded_lazy_call_never_run(virtual_clock: VirtualClock) -> None:
    """The argument calls of a lazy call run only when the lazy call does."""
    log = Log()
    program = build(
        "in x: Int\nv = Inc(Inc(x)) with lazy\nw = Inc(Inc(x)) with lazy\nout w",
        make_registry(log),
    )
    assert await program.run({"x": 1}) == {"w": 3}
    assert [c[1] for c in log.calls] == [1, 2] and virtual_clock.now() == 2.0


def test_record_literal_as_a_map() -> None:
    """`{}` and `{ a: 1 }` are accepted where a Map<String, Int> is expected."""
    registry = ModuleRegistry()

    def Total(m: dict[str, int]) -> int:
        return sum(m.values())

    registry.register("Total", Total)
    program = compile("a = Total({})\nb = Total({ x: 1, y: 2 })\nout a\nout b", modules=registry)
    assert program.run_sync({}) == {"a": 0, "b": 3}
    with pytest.raises(Exception, match="E011"):
        compile('c = Total({ x: "no" })\nout c', modules=registry)


def test_the_old_name_of_a_traced_run_warns() -> None:
    """dsl.RunResult still works for one release and names the new spelling."""
    import timebound.dsl as dsl

    with pytest.warns(DeprecationWarning, match="timebound.dsl.TracedRun"):
        assert dsl.RunResult is TracedRun  # type: ignore[attr-defined]
