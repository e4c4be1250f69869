"""`timebound run` and `timebound check`, invoked in-process through timebound.cli.main."""

from __future__ import annotations

import itertools
import json
import pathlib
import re
import sys
import textwrap

import pytest

from timebound.cli import main

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
_ids = itertools.count()

MODULES = """
import asyncio
from timebound.dsl import ModuleRegistry

registry = ModuleRegistry()

@registry.module
def Greet(name: str) -> str:
    return "hello " + name

@registry.module
def Add(a: int, b: float) -> float:
    return a + b

@registry.module
async def Hang(x: int) -> int:
    await asyncio.sleep(3600)
    return x

@registry.module
def Boom(x: int) -> int:
    raise ValueError("boom")
"""


@pytest.fixture
def workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A temporary current directory; sys.path is restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def _setup(workdir: pathlib.Path, program: str, modules: str = MODULES) -> tuple[str, str]:
    """Write prog.cst and a uniquely named module; returns (file, module name)."""
    name = f"cst_mods_{next(_ids)}"
    (workdir / f"{name}.py").write_text(modules)
    (workdir / "prog.cst").write_text(textwrap.dedent(program).lstrip())
    return "prog.cst", name


GREET = """
in who: String
in n: Int
in f: Float
in b: Boolean
in tags: List<String>
g = Greet(who)
s = Add(n, f)
t = if (b) tags else []
out g
out s
out t
"""


def _argv(name: str) -> list[str]:
    return [
        "--input",
        "who=Ada",
        "--input",
        "n=2",
        "--input",
        "f=0.5",
        "--input",
        "b=true",
        "--input",
        'tags=["x", "y"]',
    ]


def test_run_prints_outputs(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Outputs print as `name = value`, inputs converted by their declared types."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, *_argv(mod)]) == 0
    assert capsys.readouterr().out == 'g = hello Ada\ns = 2.5\nt = ["x", "y"]\n'


def test_run_json(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the outputs as one JSON object."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, "--json", *_argv(mod)]) == 0
    assert json.loads(capsys.readouterr().out) == {"g": "hello Ada", "s": 2.5, "t": ["x", "y"]}


def test_run_inputs_json(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--inputs-json gives every input; --input overrides one."""
    file, mod = _setup(workdir, GREET)
    (workdir / "in.json").write_text(
        json.dumps({"who": "Bo", "n": 1, "f": 1.0, "b": False, "tags": []})
    )
    code = main(["run", file, "--modules", mod, "--inputs-json", "in.json", "--input", "n=5"])
    assert code == 0
    assert capsys.readouterr().out == "g = hello Bo\ns = 6.0\nt = []\n"


def test_run_trace_table(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--trace adds a timeline: a header, a row per call with its position, and a legend."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, "--trace", *_argv(mod)]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("call"))
    assert "start ms" in header and "end ms" in header and "tries" in header
    rows = [line for line in out if line.startswith(("Greet", "Add"))]
    assert len(rows) == 2 and "6:5" in rows[0] and "ok" in rows[0] and "|" in rows[0]
    assert out[-1].startswith("legend:")


def test_run_json_trace(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json --trace prints {outputs, trace} with one record per call."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, "--json", "--trace", *_argv(mod)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outputs"]["g"] == "hello Ada"
    assert [
        (t["module"], t["line"], t["column"], t["attempts"], t["outcome"]) for t in doc["trace"]
    ] == [("Greet", 6, 5, 1, "ok"), ("Add", 7, 5, 1, "ok")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "n=two"], "--input n: cannot read 'two' as Int"),
        (["--input", "b=yes"], "--input b: cannot read 'yes' as Boolean: expected true or false"),
        (["--input", "tags=[1"], "--input tags: cannot read '[1' as List<String>"),
        (["--input", "zz=1"], "--input zz: the program has no input 'zz'"),
        (["--input", "who"], "--input 'who': expected NAME=VALUE"),
        (["--timeout", "soon"], "invalid --timeout 'soon'"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--inputs-json", "nope.json"], "cannot read nope.json"),
        # Int, Float: the literal forms of the language, not everything Python's int() takes
        (["--input", "n=1_000"], "--input n: cannot read '1_000' as Int"),
        (["--input", "n= 5"], "--input n: cannot read ' 5' as Int"),
        (["--input", "n=\uff15"], "--input n: cannot read '\uff15' as Int"),
        (["--input", "f=1_0.5"], "--input f: cannot read '1_0.5' as Float"),
        (["--input", "f=nan"], "--input f: cannot read 'nan' as Float"),
    ],
)
def test_run_usage_errors_exit_2(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """Bad command-line input exits 2 with a message naming what is wrong."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, *args]) == 2
    assert message in capsys.readouterr().err


def test_run_missing_input_exits_2(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An input left out is named (InputError), exit 2."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, "--input", "who=A"]) == 2
    assert "missing input 'n' (Int)" in capsys.readouterr().err


def test_run_failure_exits_1_with_the_call_site(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed call: exit 1, FILE:LINE:COL, the error, the source line and a caret."""
    file, mod = _setup(workdir, "in x: Int\n\ny =   Boom(x)\nout y\n")
    assert main(["run", file, "--modules", mod, "--input", "x=1"]) == 1
    err = capsys.readouterr().err
    assert err == ("prog.cst:3:7: run failed: ValueError: boom\n    y =   Boom(x)\n          ^\n")


def test_run_timeout_exits_1(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--timeout bounds the whole run; a run that outlives it fails with exit 1."""
    file, mod = _setup(workdir, "in x: Int\ny = Hang(x)\nout y\n")
    assert main(["run", file, "--modules", mod, "--input", "x=1", "--timeout", "20ms"]) == 1
    assert "DeadlineExceeded: run timed out after 20ms" in capsys.readouterr().err


def test_run_compile_errors_exit_1(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run refuses a program with errors: diagnostics on stderr, exit 1."""
    file, mod = _setup(workdir, "y = Nope(1)\nout y\n")
    assert main(["run", file, "--modules", mod]) == 1
    assert "prog.cst:1:5: error E009: Unknown module 'Nope'" in capsys.readouterr().err


def test_check_ok(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check on a good program: exit 0 and a summary."""
    file, mod = _setup(workdir, GREET)
    assert main(["check", file, "--modules", mod]) == 0
    assert capsys.readouterr().out == "prog.cst: ok (5 inputs, 3 outputs, 0 warnings)\n"


def test_check_errors(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check prints each diagnostic as FILE:LINE:COL: error CODE: message + line + caret."""
    file, mod = _setup(workdir, 'in x: Int\ny = Greet("a") with timeout: 0s\nout y\n')
    assert main(["check", file, "--modules", mod]) == 1
    assert capsys.readouterr().out == (
        "prog.cst:2:30: error E016: Invalid value for 'timeout': 0s (must be > 0)\n"
        '    y = Greet("a") with timeout: 0s\n'
        "    " + " " * 29 + "^\n"
    )


def test_check_warnings_exit_0(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Warnings alone do not fail check."""
    file, mod = _setup(workdir, 'y = Greet("a") with delay: 1s\nout y\n')
    assert main(["check", file, "--modules", mod]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prog.cst:1:21: warning W001: 'delay' without 'retry' has no effect\n")
    assert out.endswith("prog.cst: ok (0 inputs, 1 outputs, 1 warnings)\n")


@pytest.mark.parametrize(
    ("modules", "spec", "message"),
    [
        (MODULES, "no_such_module_xyz", "--modules: cannot import 'no_such_module_xyz'"),
        ("x = 1\n", None, "defines no ModuleRegistry at module level"),
        (MODULES + "\nother = ModuleRegistry()\n", None, "defines several registries; pick one"),
        (MODULES, ":nothing", "is not a ModuleRegistry"),
        ('raise RuntimeError("no config")\n', None, "RuntimeError: no config"),
        ("def f(:\n", None, "SyntaxError"),
    ],
)
def test_bad_modules_exit_2(
    workdir: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    modules: str,
    spec: str | None,
    message: str,
) -> None:
    """An unimportable module, or one without exactly one registry, is a usage error."""
    file, mod = _setup(workdir, 'y = Greet("a")\nout y\n', modules)
    if spec is None:
        spec = mod
    elif spec.startswith(":"):
        spec = mod + spec
    assert main(["check", file, "--modules", spec]) == 2
    assert message in capsys.readouterr().err


def test_pick_a_registry_by_name(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--modules MOD:name picks one of several registries."""
    file, mod = _setup(workdir, 'y = Greet("a")\nout y\n', MODULES + "\nother = ModuleRegistry()\n")
    assert main(["run", file, "--modules", f"{mod}:registry"]) == 0
    assert capsys.readouterr().out == "y = hello a\n"


def test_missing_file_exits_2(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable program file is a usage error."""
    _, mod = _setup(workdir, "y = 1\nout y\n")
    assert main(["check", "missing.cst", "--modules", mod]) == 2
    assert "cannot read missing.cst" in capsys.readouterr().err


def test_run_without_modules_has_the_standard_library_only(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --modules a call of an application module is an unknown module (exit 1)."""
    (workdir / "prog.cst").write_text("in x: Int\ny = Hang(x)\nout y\n")
    assert main(["run", "prog.cst", "--input", "x=1"]) == 1
    assert "E009: Unknown module 'Hang'" in capsys.readouterr().err


def test_resilience_tour(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's command: cd examples && timebound run resilience_tour.cst ... --trace."""
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["run", "resilience_tour.cst", "--modules", "resilience_tour", "--trace"]) == 0
    out = capsys.readouterr().out
    assert 'quote = {"sku": "A-17", "stock": 42, "price": 22.5, "currency": "USD"}' in out
    assert 'recs = ["bestsellers", "new arrivals"]' in out
    assert "2 failed; waited 100ms, 200ms" in out
    assert "1 timed out" in out
    assert "fallback used" in out
    assert "cache hit" in out


def test_failed_run_with_trace_shows_the_calls(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--trace on a failed run prints the timeline (to stderr) before the failure."""
    file, mod = _setup(workdir, 'in x: Int\na = Greet("a")\ny = Boom(x)\nout a\nout y\n')
    assert main(["run", file, "--modules", mod, "--input", "x=1", "--trace"]) == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err
    assert any(line.startswith("Boom") and "error" in line for line in err.splitlines())


@pytest.mark.parametrize("program", sorted(p.name for p in EXAMPLES.glob("*.cst")))
def test_every_example_checks(
    program: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each examples/NAME.cst compiles against examples/NAME.py without warnings."""
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["check", program, "--modules", program.removesuffix(".cst")]) == 0
    assert capsys.readouterr().out.endswith(" 0 warnings)\n")


def test_user_profile_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user_profile example runs: the slow cache is cut, the database answers."""
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setattr(sys, "path", list(sys.path))
    argv = ["run", "user_profile.cst", "--modules", "user_profile", "--json"]
    assert main([*argv, "--input", "userId=u1", "--input", "defaultScore=0"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "cached": {"id": "u1", "name": "Ada", "score": 17},
        "score": 17,
        "badge": "HIGH",
    }


@pytest.mark.parametrize(
    ("text", "value"), [("-3", -3), ("+4", 4), ("1e3", 1000.0), ("-.5", -0.5), ("7.", 7.0)]
)
def test_run_number_inputs(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str], text: str, value: float
) -> None:
    """Signed integers and the usual float spellings are read as numbers."""
    file, mod = _setup(workdir, "in x: Float\nout x\n")
    assert main(["run", file, "--modules", mod, "--json", "--input", f"x={text}"]) == 0
    assert json.loads(capsys.readouterr().out) == {"x": value}


def test_run_map_with_int_keys(workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON object keys are strings: a Map<Int, V> input (also nested) reads them as Int."""
    file, mod = _setup(workdir, "in m: List<Map<Int, Boolean>>\nout m\n")
    (workdir / "in.json").write_text('{"m": [{"1": true, "-2": false}]}')
    assert main(["run", file, "--modules", mod, "--json", "--input", 'm=[{"3": true}]']) == 0
    assert json.loads(capsys.readouterr().out) == {"m": [{"3": True}]}
    assert main(["run", file, "--modules", mod, "--json", "--inputs-json", "in.json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"m": [{"1": True, "-2": False}]}


def test_run_map_with_bad_int_key_exits_2(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Map<Int, V> key that is not an integer is a usage error naming the input."""
    file, mod = _setup(workdir, "in m: Map<Int, Int>\nout m\n")
    assert main(["run", file, "--modules", mod, "--input", 'm={"one": 1}']) == 2
    assert "input 'm' key must be Int, got str 'one'" in capsys.readouterr().err


def test_run_file_with_byte_order_mark(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program saved with a UTF-8 byte order mark and CRLF line endings runs."""
    _, mod = _setup(workdir, "y = 1\nout y\n")
    (workdir / "bom.cst").write_bytes(b'\xef\xbb\xbfy = Greet("a")\r\nout y\r\n')
    assert main(["run", "bom.cst", "--modules", mod]) == 0
    assert capsys.readouterr().out == "y = hello a\n"


def test_run_failure_caret_after_a_form_feed(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The failing line shown is the one the position names, whatever a comment contains."""
    file, mod = _setup(workdir, "in x: Int # a\u2028b\ny = Boom(x)\nout y\n")
    assert main(["run", file, "--modules", mod, "--input", "x=1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("prog.cst:2:5: run failed: ValueError: boom")
    assert err[1:] == ["    y = Boom(x)", "        ^"]


def test_run_json_wrap_has_every_field(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An `on_error: wrap` value prints with all of ok, value and error, as its type has."""
    file, mod = _setup(
        workdir,
        'a = Boom(1) with on_error: wrap\nb = Greet("x") with on_error: wrap\nout a\nout b\n',
    )
    assert main(["run", file, "--modules", mod, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "a": {"ok": False, "value": None, "error": "ValueError: boom"},
        "b": {"ok": True, "value": "hello x", "error": None},
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"who": ', "--inputs-json in.json: invalid JSON"),
        (b'["who"]', "--inputs-json in.json: expected a JSON object"),
        (b"\xff\xfe", "cannot read in.json"),
        (b"[" * 100_000, "--inputs-json in.json: invalid JSON"),
        (b'{"who": "A", "n": 1, "f": NaN, "b": true, "tags": []}', "must be a finite Float"),
        (b'{"who": "A", "n": "1", "f": 1, "b": true, "tags": []}', "input 'n' must be Int"),
        (b'{"who": "A", "n": 1, "f": 1, "b": true, "tags": [], "x": 1}', "unknown input 'x'"),
    ],
)
def test_run_inputs_json_errors_exit_2(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    """A bad --inputs-json file (unreadable, not JSON, not an object, wrong values) exits 2."""
    file, mod = _setup(workdir, GREET)
    (workdir / "in.json").write_bytes(content)
    assert main(["run", file, "--modules", mod, "--inputs-json", "in.json"]) == 2
    assert message in capsys.readouterr().err


def test_run_inputs_json_with_byte_order_mark(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An inputs file saved with a byte order mark is read."""
    file, mod = _setup(workdir, GREET)
    doc = b'{"who": "Bo", "n": 1, "f": 1.0, "b": false, "tags": []}'
    (workdir / "in.json").write_bytes(b"\xef\xbb\xbf" + doc)
    assert main(["run", file, "--modules", mod, "--inputs-json", "in.json"]) == 0
    assert capsys.readouterr().out == "g = hello Bo\ns = 2.0\nt = []\n"


def test_run_json_failure_prints_an_error_object(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --json a failed run prints one JSON error object, with the call site, on stdout."""
    file, mod = _setup(workdir, "in x: Int\n\ny =   Boom(x)\nout y\n")
    assert main(["run", file, "--modules", mod, "--input", "x=1", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "error": {
            "type": "ValueError",
            "code": None,
            "message": "boom",
            "file": "prog.cst",
            "call_site": {"module": "Boom", "line": 3, "column": 7},
        }
    }
    assert captured.err == ""


def test_run_json_trace_failure_keeps_the_trace(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --json --trace a failed run's error object comes with the calls that ran."""
    file, mod = _setup(workdir, "in x: Int\ny = Boom(x)\nout y\n")
    assert main(["run", file, "--modules", mod, "--input", "x=1", "--json", "--trace"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["type"] == "ValueError"
    assert [(t["module"], t["outcome"]) for t in doc["trace"]] == [("Boom", "error")]


def test_run_json_timeout_error_has_its_code(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that times out reports DeadlineExceeded with its stable code in the JSON error."""
    file, mod = _setup(workdir, "in x: Int\ny = Hang(x) with timeout: 10ms\nout y\n")
    assert main(["run", file, "--modules", mod, "--input", "x=1", "--json"]) == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["type"], error["call_site"]["module"]) == ("DeadlineExceeded", "Hang")
    assert error["code"] is not None and "timed out" in error["message"]


@pytest.mark.parametrize("value", ["-1s", "0s", "5 s", "1.5s", "soon"])
def test_run_bad_timeout_is_a_clear_usage_error(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--timeout with a negative, zero or malformed duration exits 2 naming the option."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, *_argv(mod)[2:], "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("timebound run: ") and "--timeout" in err and repr(value) in err
    assert "positive duration such as 2s" in err


@pytest.mark.parametrize("value", ["9" * 400 + "s", "9" * 5000 + "ms"])
def test_run_huge_timeout_is_one_usage_line(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--timeout too large for a float exits 2 with one line saying so, not a traceback."""
    file, mod = _setup(workdir, GREET)
    assert main(["run", file, "--modules", mod, *_argv(mod)[2:], "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("timebound run: invalid --timeout ")
    assert "too large to represent" in err and "Traceback" not in err


@pytest.mark.parametrize("spelling", ["{name}.py", "./{name}.py", "{dir}/{name}.py"])
def test_modules_given_as_a_file(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    """--modules accepts the module's file (shop.py, ./shop.py, an absolute path)."""
    file, mod = _setup(workdir, "in who: String\ng = Greet(who)\nout g\n")
    spec = spelling.format(name=mod, dir=workdir)
    assert main(["run", file, "--modules", spec, "--input", "who=Ada"]) == 0
    assert capsys.readouterr().out == "g = hello Ada\n"


def test_modules_file_from_another_directory(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--modules lib/x.py imports x from lib/, with a registry picked by :NAME."""
    file, mod = _setup(workdir, "in who: String\ng = Greet(who)\nout g\n")
    (workdir / "lib").mkdir()
    (workdir / f"{mod}.py").rename(workdir / "lib" / f"{mod}.py")
    spec = f"lib/{mod}.py:registry"
    assert main(["run", file, "--modules", spec, "--input", "who=Ada"]) == 0
    assert capsys.readouterr().out == "g = hello Ada\n"


def test_modules_missing_file_says_what_to_write(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--modules naming a file that does not exist answers with the spellings it accepts."""
    file, _ = _setup(workdir, GREET)
    assert main(["check", file, "--modules", "./nowhere.py"]) == 2
    assert capsys.readouterr().err == (
        "timebound check: --modules ./nowhere.py: no such Python file; give a file such as "
        "shop.py or ./lib/shop.py, or a module name such as shop\n"
    )


def test_check_without_modules_checks_syntax_and_types(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check without --modules accepts calls it cannot see and says they were not checked."""
    _setup(workdir, "in who: String\ng = Greet(who) with timeout: 1s\nout g\n")
    assert main(["check", "prog.cst"]) == 0
    assert capsys.readouterr().out == (
        "prog.cst:2:5: info TB-T030: worst case 1s: 1 attempt, 1s each\n"
        "prog.cst: ok without modules (0 warnings; module calls not checked: "
        "add --modules MODULE to check them)\n"
    )


def test_check_without_modules_reports_other_errors(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check without --modules still reports type and option errors, not the unknown calls."""
    _setup(workdir, "in who: String\ng = Greet(who) with timeout: 0s\nh = who + 1\nout g\nout h\n")
    assert main(["check", "prog.cst"]) == 1
    out = capsys.readouterr().out
    assert "prog.cst:2:" in out and "E016" in out
    assert "prog.cst:3:" in out and "E011" in out
    assert "E009" not in out


def test_check_without_modules_syntax_error(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check without --modules reports a syntax error with its position and exits 1."""
    _setup(workdir, "in who: String\ng = Greet(who\nout g\n")
    assert main(["check", "prog.cst"]) == 1
    assert "E001" in capsys.readouterr().out


def test_failed_run_with_trace_shows_where_the_budget_went(
    workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--trace on a run cut by its --timeout prints the breakdown tree (D13.7)."""
    program = "in x: Int\ny = Hang(x) with timeout: 30ms, retry: 9, delay: 10ms\nout y\n"
    file, mod = _setup(workdir, program)
    argv = ["run", file, "--modules", mod, "--input", "x=1", "--timeout", "150ms", "--trace"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "where the budget went:" in err
    tree = err.split("where the budget went:")[1]
    # Real time on a busy machine: how many attempts fit varies, each one's budget does not.
    assert re.search(r"attempt Hang \((timeout|cancelled)\): [\d.]+m?s of 30ms", tree), tree
    assert main([*argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    kinds = {p["k"] for p in doc["breakdown"]["p"]}
    assert "attempt" in kinds
