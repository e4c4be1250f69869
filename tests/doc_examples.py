"""Shared runner for the Python examples in README.md and docs/*.md.

Every ```python block is executed as its own module. A line ``print(...)  # expected`` promises
that the corresponding printed line is exactly ``expected`` (text after `` — `` is commentary), and
an example that promises anything must print exactly its promises; a ``# prints:`` comment block
promises the whole output, line for line. Blocks that only define
``test_*`` functions are pytest examples: they have to compile and import.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
_PROMISE = re.compile(r"^\s*print\(.*\)\s+# (.+)$", re.M)
_PRINTS = re.compile(r"^# prints:\n((?:# .*\n?)+)", re.M)


def examples(*relative_paths: str) -> list[Any]:
    """pytest params ``(name, code)`` for every Python block of the given files."""
    params = []
    for rel in relative_paths:
        text = (ROOT / rel).read_text(encoding="utf-8")
        for i, m in enumerate(_BLOCK.finditer(text)):
            indent, code = m.group(1), m.group(2)
            if indent:
                code = "\n".join(line.removeprefix(indent) for line in code.splitlines())
            params.append(pytest.param(f"{rel}[{i}]", code, id=f"{rel}[{i}]"))
    return params


def run_example(name: str, code: str) -> list[str]:
    """Execute one example; check its printed promises; return what it printed."""
    buf = io.StringIO()
    module_name = f"doc_example_{abs(hash(name))}"
    module = types.ModuleType(module_name)
    sys.modules[module_name] = module  # dataclasses and pickle look their module up
    if 'if __name__ == "__main__":' in code:
        module.__dict__["__name__"] = "__main__"  # a script example: run its main block
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, name, "exec"), module.__dict__)
    finally:
        # By the name it was registered under: module.__name__ may now read "__main__", and
        # deleting that entry broke every later multiprocessing spawn in the session.
        del sys.modules[module_name]
    printed = buf.getvalue().splitlines()
    block = _PRINTS.search(code)
    if block is not None:
        assert printed == [line[2:] for line in block.group(1).splitlines()], name
    elif promises := [p.split(" — ", 1)[0].rstrip() for p in _PROMISE.findall(code)]:
        assert printed == promises, name
    return printed
