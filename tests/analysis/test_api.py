"""``check_time``: one entry point, the input's kind, Python modules of policies (D14.1, D14.3)."""

from __future__ import annotations

import pathlib
import pickle
import sys
import textwrap
from collections.abc import Iterator

import pytest

import timebound as tb
from timebound import analysis
from timebound.analysis import CheckInputError, check_module, check_time

POLICIES = textwrap.dedent(
    """
    import timebound as tb
    from timebound.policies import Policy


    @tb.resilient(timeout="5s", retry=3, total_timeout="4s")
    async def charge(order: str) -> None:
        ...


    @tb.resilient(timeout="1s", retry=1)
    def fine() -> None:
        ...


    class Client:
        @tb.resilient(retry=2, delay="3s", total_timeout="5s")
        def send(self) -> None:
            ...


    SHARED = Policy("shared", timeout="2s", retry=1, fallback=None)
    """
)


@pytest.fixture
def policies(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A module of policies in a temporary directory; sys.path and sys.modules restored."""
    path = tmp_path / "tb_check_policies.py"
    path.write_text(POLICIES)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "tb_check_policies", raising=False)
    yield path
    sys.modules.pop("tb_check_policies", None)


def test_a_module_of_policies_from_its_file(policies: pathlib.Path) -> None:
    """Every decorated function, method and Policy of the module, at its file and line."""
    report = check_time(str(policies))
    assert report.kind == "policy" and not report.ok
    by_subject = {(f.subject, f.code) for f in report.findings}
    assert ("tb_check_policies.charge", "TB-T004") in by_subject
    assert ("tb_check_policies.Client.send", "TB-T001") in by_subject
    assert ("tb_check_policies.fine", "TB-T030") in by_subject
    assert ("tb_check_policies.SHARED", "TB-T030") in by_subject
    (charge,) = [f for f in report.findings if f.code == "TB-T004"]
    assert charge.where.file == str(policies) and charge.where.line == 6
    assert str(charge.where) == f"{policies}:6 (timeout)"


def test_a_module_by_name_and_as_an_object(policies: pathlib.Path) -> None:
    """kind='policy' with a dotted name imports it; a module object is checked as it is."""
    sys.path.insert(0, str(policies.parent))
    by_name = check_time("tb_check_policies", kind="policy")
    module = sys.modules["tb_check_policies"]
    assert check_module(module).codes() == by_name.codes()


def test_a_service_checks_its_own_policy_at_start_up() -> None:
    """A decorated function or a Policy is checked directly, under the caller's budget."""

    @tb.resilient(timeout="1s", retry=2, fallback=None)
    def lookup() -> None: ...

    assert check_time(lookup).ok
    report = check_time(lookup, budget="2500ms")
    assert "TB-T005" in report.codes() and report.budget == 2.5


def test_the_kind_from_the_content(tmp_path: pathlib.Path) -> None:
    """A .txt file holding a workflow definition is told by its initial_node."""
    path = tmp_path / "flow.txt"
    path.write_text(
        '{"id": "w", "timeout_ms": 1000, "initial_node": "a",'
        ' "actions": [{"id": "x", "kind": "python", "implementation": {"handler": "x"},'
        ' "execution": {"timeout_ms": 2000}}], "nodes": [{"id": "a", "action_id": "x"}]}'
    )
    assert check_time(path).codes() == ["TB-T010"]


def test_an_unknown_kind_names_the_choices(tmp_path: pathlib.Path) -> None:
    """A file that says nothing about its kind is a CheckInputError naming --kind."""
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(CheckInputError) as info:
        check_time(path)
    assert "--kind" in str(info.value) and info.value.path == str(path)
    assert isinstance(info.value, tb.InvalidInput) and info.value.code == "check-input"
    with pytest.raises(CheckInputError):
        check_time(path, kind="bogus")  # type: ignore[arg-type]


def test_unreadable_inputs(tmp_path: pathlib.Path) -> None:
    """Missing files, bytes that are not UTF-8 and files past the cap are CheckInputErrors."""
    with pytest.raises(CheckInputError, match="cannot read"):
        check_time(tmp_path / "missing.cst")
    bad = tmp_path / "bad.cst"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CheckInputError, match="not UTF-8"):
        check_time(bad)
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(analysis._input.MAX_BYTES + 1)
    with pytest.raises(CheckInputError, match="larger than"):
        check_time(big)


def test_a_module_that_does_not_import(tmp_path: pathlib.Path) -> None:
    """An import error is a CheckInputError saying what the module raised."""
    path = tmp_path / "tb_check_broken.py"
    path.write_text("raise RuntimeError('no config')\n")
    try:
        with pytest.raises(CheckInputError, match="RuntimeError: no config"):
            check_time(path)
    finally:
        sys.path.remove(str(tmp_path))


def test_an_object_it_cannot_check() -> None:
    """Anything else is a CheckInputError naming what it takes."""
    with pytest.raises(CheckInputError, match="cannot check int objects"):
        check_time(42)


def test_the_error_pickles() -> None:
    """CheckInputError keeps its message and path through pickling."""
    err = pickle.loads(pickle.dumps(CheckInputError("bad", path="x.json")))
    assert (str(err), err.path, err.field) == ("bad", "x.json", "x.json")


def test_a_bad_budget_is_a_configuration_error() -> None:
    """A budget that is not a positive duration names the option."""
    with pytest.raises(tb.ConfigurationError) as info:
        check_time(lambda: None, budget="-1s")
    assert info.value.option == "budget"


def test_a_compiled_program() -> None:
    """A compiled Constellation Program is checked from the source it keeps."""
    from timebound.dsl import ModuleRegistry, compile

    registry = ModuleRegistry()

    @registry.module
    def Fetch(x: int) -> int:
        return x

    program = compile("y = Fetch(1) with timeout: 2s\nout y\n", modules=registry)
    assert check_time(program, budget="1s").codes()[0] == "TB-T004"
