"""The `timebound` command itself: version, help, lazy commands, a closed pipe."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import timebound
from timebound.cli import build_parser, main

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _timebound(*args: str, stdout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "timebound", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version and exits 0."""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"timebound {timebound.__version__}\n"


def test_top_level_help_is_argparses_at_every_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """`timebound --help` is laid out without argparse, exactly as argparse lays it out: the
    parser's own help is compared at every terminal width (a narrow one, where the usage line
    would wrap, is left to argparse)."""
    from timebound.cli import _top_level_help

    laid_out = 0
    for width in range(1, 301):
        monkeypatch.setenv("COLUMNS", str(width))
        ours = _top_level_help(width)
        if ours is None:
            assert width < 60, width  # every common terminal takes the fast path
            continue
        laid_out += 1
        assert ours == build_parser().format_help(), width
    assert laid_out > 240


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_do_not_import_argparse(option: str) -> None:
    """argparse's import is half of what `timebound --help` costs beyond starting Python."""
    code = (
        "import contextlib, io, sys\n"
        "from timebound.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main([{option!r}])\n"
        "print('argparse' in sys.modules, code, 'timebound' in out.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "False 0 True\n", done.stderr


def test_help_lists_every_command_without_importing_them() -> None:
    """--help lists each command, importing neither the commands nor the deadline core."""
    code = (
        "import sys, contextlib, io\n"
        "from timebound.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, "
        "contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('timebound.'))\n"
        "print(loaded, all(c in out.getvalue() for c in ('demo', 'run', 'check')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "['timebound._version', 'timebound.cli'] True\n", done.stderr


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_do_not_import_shutil(option: str) -> None:
    """argparse sizes its help with shutil, which imports bz2 and lzma: the command line sizes it
    itself, so `timebound --help` costs that much less."""
    code = (
        "import contextlib, io, sys\n"
        "from timebound.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, "
        "contextlib.suppress(SystemExit):\n"
        f"    main([{option!r}])\n"
        "print('shutil' in sys.modules, 'timebound' in out.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "False True\n", done.stderr


def test_help_is_as_wide_as_columns_says() -> None:
    """The width follows $COLUMNS as argparse's own rule does (shutil's)."""
    code = (
        "import contextlib, io\n"
        "from timebound.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, "
        "contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "print(max(len(line) for line in out.getvalue().splitlines()))\n"
    )
    env = {**os.environ, "COLUMNS": "60"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) <= 58


def test_a_command_imports_only_its_own_module() -> None:
    """Parsing `demo` imports the demo command, not the Constellation one."""
    code = (
        "import sys\n"
        "from timebound.cli import build_parser\n"
        "build_parser(['demo'])\n"
        "print('timebound.cli._demo' in sys.modules, 'timebound.cli._dsl' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "True False\n", done.stderr


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """`timebound` alone prints the help and exits 2."""
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_demo_help_is_plain_text() -> None:
    """`timebound demo --help` shows its description without reST markup."""
    text = build_parser(["demo"])._subparsers._group_actions[0].choices["demo"].format_help()  # type: ignore[union-attr]
    assert "timebound demo: a short, real demonstration" in text
    assert "``" not in text and ":func:" not in text


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # no reader at all: writing fails, deterministically
    try:
        return _timebound(*args, stdout=write)
    finally:
        os.close(write)


def test_closed_pipe_ends_a_command_quietly() -> None:
    """A command whose reader went away (`| head`) exits 141 without a traceback."""
    done = _into_a_closed_pipe(
        "run",
        str(EXAMPLES / "hello.cst"),
        "--modules",
        str(EXAMPLES / "hello.py"),
        "--input",
        "name=Ada",
    )
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_closed_pipe_after_help_or_version_is_quiet(option: str) -> None:
    """--help and --version into a closed pipe print no traceback."""
    assert _into_a_closed_pipe(option).stderr == ""
