"""One way to name the user's code for every command and for ``timebound serve`` (D12.3): a
dotted module name found from the current directory, or the path of a ``.py`` file.

Run through the installed ``timebound`` script in a subprocess: started that way (unlike
``python -m``), Python does not put the current directory on the path, which is what a user's
shell does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from timebound import ConfigurationError, InvalidInput
from timebound.lowlevel import load_module

SCRIPT = Path(sys.executable).parent / "timebound"

HANDLERS = "async def work(ctx):\n    return {'ok': True}\n"
CONNECTORS = """
class _Connector:
    async def status(self, op):
        raise NotImplementedError
    async def cancel(self, op):
        raise NotImplementedError

def connectors():
    return {"reports": _Connector()}
"""
FLOW = {
    "id": "quick",
    "timeout_ms": 60000,
    "initial_node": "a",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [{"id": "a", "action_id": "work"}],
}
REGISTRY = """
from timebound.dsl import ModuleRegistry

registry = ModuleRegistry()

@registry.module
def Greet(name: str) -> str:
    return "hello " + name
"""


def _timebound(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.is_file(), f"the timebound script is installed next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "far_handlers.py").write_text(HANDLERS)
    (tmp_path / "conn.py").write_text(CONNECTORS)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "quick.json").write_text(json.dumps(FLOW))
    return tmp_path


def test_serve_loads_a_module_from_the_current_directory(project: Path) -> None:
    r = _timebound(
        project, "serve", "--check", "--actions", "handlers", "--connectors", "conn",
        "--workflows", "flows", "--db", f"sqlite:///{project}/h.db",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == "configuration is valid; definitions: quick\n"


def test_serve_loads_python_files_by_path(project: Path) -> None:
    r = _timebound(
        project, "serve", "--check", "--actions", "lib/far_handlers.py", "--connectors",
        "./conn.py", "--workflows", "flows", "--db", f"sqlite:///{project}/h.db",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == "configuration is valid; definitions: quick\n"


def test_serve_names_a_missing_file(project: Path) -> None:
    r = _timebound(project, "serve", "--check", "--actions", "lib/nowhere.py")
    assert r.returncode == 2
    assert r.stderr.startswith("timebound serve: actions lib/nowhere.py: no such Python file")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("actions", ["handlers", "./handlers.py", "lib/far_handlers.py"])
def test_workflow_run_loads_the_same_way(project: Path, actions: str) -> None:
    r = _timebound(
        project, "workflow", "run", "flows/quick.json", "--actions", actions,
        "--db", f"sqlite:///{project}/run.db",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "completed" in r.stdout


def test_a_file_is_loaded_even_when_its_name_is_taken(project: Path) -> None:
    """``./json.py`` is the user's file, not the standard library's json already imported
    under that name."""
    (project / "json.py").write_text(REGISTRY)
    (project / "prog.cst").write_text("in name: String\ny = Greet(name)\nout y\n")
    r = _timebound(project, "check", "prog.cst", "--modules", "./json.py")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "a module is a dotted name or a .py file"),
        ("lib/notes.txt", "no such Python file"),
        ("./no-such.py", "no such Python file"),
        ("timebound_no_such_module_xyz", "cannot import 'timebound_no_such_module_xyz'"),
    ],
)
def test_bad_names_are_invalid_input(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_module(spec, what="--actions")
    assert isinstance(info.value, InvalidInput)
    assert info.value.option == "--actions"
    assert message in str(info.value)


def test_an_error_raised_while_loading_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad-name.py").write_text("x = 1\n")
    with pytest.raises(ConfigurationError, match="'bad-name' cannot be a module name"):
        load_module(str(tmp_path / "bad-name.py"))
    (tmp_path / "broken.py").write_text("raise RuntimeError('no config here')\n")
    r = _timebound(tmp_path, "serve", "--check", "--actions", "broken")
    assert r.returncode == 2
    assert "actions: cannot import 'broken': RuntimeError: no config here" in r.stderr
