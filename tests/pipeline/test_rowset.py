"""RowSet overlays (commit/rollback without copying rows), rowset ops, expressions, the
registry's own checks."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timebound import ConfigurationError
from timebound import pipeline as pl
from timebound.pipeline._rowset import RowSet

KEYS = ["a", "b", "c", "d"]


def base(n: int) -> RowSet:
    return RowSet({k: pa.array([float(i) for i in range(n)]) for k in KEYS[:2]}, n)


def snapshot(rs: RowSet) -> dict[str, list[Any]]:
    return rs.table().to_pydict()


writes = st.lists(
    st.tuples(st.sampled_from(KEYS), st.floats(allow_nan=False, allow_infinity=False)),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 20), staged=writes, begin_after=st.integers(0, 3))
def test_rollback_leaves_no_partial_write(
    n: int, staged: list[tuple[str, float]], begin_after: int
) -> None:
    """Property: whatever was written inside an overlay, rollback restores exactly the
    columns that were visible before it (values, keys and order)."""
    rs = base(n)
    for key, value in staged[:begin_after]:
        rs.write(key, pa.array([value] * n))
    before = snapshot(rs)
    rs.begin()
    for key, value in staged[begin_after:]:
        rs.write(key, pa.array([value] * n))
    rs.rollback()
    assert snapshot(rs) == before
    assert rs.depth == 0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 20), staged=writes)
def test_commit_applies_every_staged_write(n: int, staged: list[tuple[str, float]]) -> None:
    """Property: after commit the visible columns are the last value written to each key."""
    rs = base(n)
    expected = snapshot(rs)
    rs.begin()
    for key, value in staged:
        rs.write(key, pa.array([value] * n))
        expected[key] = [value] * n
    rs.commit()
    assert snapshot(rs) == expected


def test_nested_overlays() -> None:
    """An inner commit lands in the outer overlay; the outer rollback drops both."""
    rs = base(3)
    rs.begin()
    rs.begin()
    rs.write("c", pa.array([1.0, 2.0, 3.0]))
    rs.commit()
    assert rs.has("c")
    rs.rollback()
    assert not rs.has("c")


def test_rollback_to_drops_nested_overlays() -> None:
    """rollback_to(depth) drops that overlay and every one opened inside it."""
    rs = base(2)
    outer = rs.begin()
    rs.write("c", pa.array([1.0, 2.0]))
    rs.begin()
    rs.write("d", pa.array([1.0, 2.0]))
    rs.rollback_to(outer)
    assert (rs.depth, rs.has("c"), rs.has("d")) == (0, False, False)
    with pytest.raises(RuntimeError):
        rs.rollback_to(1)


def test_commit_and_rollback_copy_no_rows() -> None:
    """The committed column is the very array the task produced (no copy)."""
    rs = base(1000)
    column = pa.array([1.0] * 1000)
    rs.begin()
    rs.write("c", column)
    rs.commit()
    assert rs.column("c") is column


def test_commit_or_rollback_without_overlay_is_an_error() -> None:
    """Unbalanced transaction calls are programming errors, reported as such."""
    rs = base(1)
    with pytest.raises(RuntimeError):
        rs.commit()
    with pytest.raises(RuntimeError):
        rs.rollback()


def test_rowset_ops_compose_on_the_index() -> None:
    """filter, sort, take and dedupe act on the active rows in order; a write compacts."""
    rs = RowSet({"k": pa.array([3, 1, 3, 2, None, 1]), "v": pa.array(list("abcdef"))}, 6)
    rs.dedupe("k")
    assert rs.table().to_pydict() == {"k": [3, 1, 2, None], "v": ["a", "b", "d", "e"]}
    rs.sort("k", descending=True)
    assert rs.column("v").to_pylist() == ["a", "d", "b", "e"]
    rs.filter(pa.array([True, None, True, False]))
    rs.take(1)
    assert rs.table().to_pydict() == {"k": [3], "v": ["a"]}
    rs.write("w", pa.array([1.5]))
    assert (rs.index, rs.nrows) == (None, 1)


def test_expressions_evaluate_with_pyarrow_compute() -> None:
    """Operators build JSON expression trees that pyarrow.compute evaluates."""
    from timebound.pipeline import _expr

    e = ((pl.col("x") * 2 + 1 > 4) & ~pl.col("y").is_null()) | (pl.col("x") == 0)
    cols = {"x": pa.array([0, 1, 2, 3]), "y": pa.array([None, 1, None, 1])}
    assert _expr.evaluate(e.to_json(), cols.__getitem__, 4).to_pylist() == [
        True,
        False,
        False,
        True,
    ]
    assert _expr.columns(e.to_json()) == {"x", "y"}
    with pytest.raises(TypeError):
        bool(pl.col("x") > 1)
    with pytest.raises(TypeError):
        pl.lit(float("nan"))


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"fn": "system", "args": []}, "unknown function"),
        ({"fn": "add", "args": [{"col": "a"}]}, "takes 2"),
        ({"col": 5}, "key id string"),
        ({"lit": [1]}, "scalar"),
        ([], "an expression is an object"),
    ],
)
def test_hostile_expressions_are_named(node: Any, message: str) -> None:
    """A malformed expression in an artifact says what and where."""
    from timebound.pipeline import _expr

    with pytest.raises(ValueError, match=message):
        _expr.check(node)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.key("a", pa.int64()), "already registered"),
        (lambda r: r.key("b", "int64"), "pyarrow DataType"),
        (lambda r: r.key("c", pa.int64(), nullable=True, default=1), "takes no default"),
        (lambda r: r.key("d", pa.int64(), default="x"), "not a valid int64"),
        (lambda r: r.key("has space", pa.int64()), "identifier"),
        (lambda r: r.param("p", pa.int64(), default=float("inf")), "cannot be stored"),
        (lambda r: r.task(reads=["zz"], name="t")(lambda c, rows: {}), "unknown key 'zz'"),
        (
            lambda r: r.task(writes=pl.FromParam("zz"), name="t")(lambda c, rows: {}),
            "unknown param",
        ),
        (lambda r: r.task(rowset="maybe", name="t")(lambda c, rows: {}), "rowset must be"),
        (lambda r: r.task(timeout=-1, name="t")(lambda c, rows: {}), "timeout must be > 0"),
        (lambda r: r.task(timeout="1 s", name="t")(lambda c, rows: {}), "invalid timeout"),
        (lambda r: r.task(timeout=float("inf"), name="t")(lambda c, rows: {}), "finite"),
    ],
)
def test_registry_refuses_bad_definitions(call: Any, message: str) -> None:
    """Every bad key, param or task definition is a ConfigurationError that says why."""
    reg = pl.Catalog()
    reg.key("a", pa.int64())
    with pytest.raises(ConfigurationError, match=message):
        call(reg)


def test_a_generator_task_is_refused() -> None:
    """A generator cannot return columns: registering one is an error."""
    reg = pl.Catalog()

    def gen(ctx: Any, rows: Any) -> Any:
        yield {}

    with pytest.raises(ConfigurationError, match="generator"):
        reg.task()(gen)


def test_effects_evaluate_to_exact_may_unknown() -> None:
    """Write effects evaluate with link-time params to exact, may or unknown."""
    from timebound.pipeline._model import evaluate

    sw = pl.Switch("stage", {"esr": ["a"], "lsr": ["b"]})
    assert evaluate(sw, {"stage": "lsr"}).keys == {"b"}
    assert (evaluate(sw, {}).kind, evaluate(sw, {}).keys) == ("may", {"a", "b"})
    assert evaluate(pl.FromParam("k"), {"k": ["x", "y"]}).keys == {"x", "y"}
    assert evaluate(pl.Union(["a"], sw), {"stage": "esr"}).kind == "exact"
    assert evaluate(pl.Union(["a"], pl.Unknown()), {}).kind == "unknown"
