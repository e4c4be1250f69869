"""Every Python example in docs/constellation.md runs and prints what its comments promise."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "constellation.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
_PROMISE = re.compile(r"^\s*print\(.*\)\s+# (.+)$", re.M)
_PRINTS = re.compile(r"^# prints:\n((?:# .*\n?)+)", re.M)


def _examples() -> list[tuple[int, str]]:
    return list(enumerate(m.group(1) for m in _BLOCK.finditer(DOC.read_text())))


@pytest.mark.parametrize(("index", "code"), _examples())
def test_example_runs_and_prints_what_it_promises(index: int, code: str) -> None:
    """The example executes and its output matches its `# comment` / `# prints:` lines."""
    buf = io.StringIO()
    module = types.ModuleType(f"constellation_doc_{index}")
    sys.modules[module.__name__] = module  # TypedDicts and dataclasses look their module up
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"constellation.md[{index}]", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    printed = buf.getvalue().splitlines()
    block = _PRINTS.search(code)
    if block is not None:
        assert printed == [line[2:] for line in block.group(1).splitlines()]
    else:
        assert printed == _PROMISE.findall(code)


def test_there_are_examples() -> None:
    """The page keeps its runnable examples."""
    assert len(_examples()) >= 4
