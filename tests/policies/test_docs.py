"""Every Python example in docs/policies.md and docs/telemetry.md runs and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# `print(...)  # expected output — explanation`: the comment before " — " is the promised output.
_PROMISE = re.compile(r"^\s*print\(.*\)\s+# (.+)$", re.M)


def _examples() -> list[tuple[str, int, str]]:
    out = []
    for name in ("policies.md", "telemetry.md"):
        path = DOCS / name
        if path.exists():
            for i, m in enumerate(_BLOCK.finditer(path.read_text())):
                out.append((name, i, m.group(1)))
    return out


@pytest.mark.parametrize(("doc", "index", "code"), _examples())
def test_example_runs_and_prints_what_it_promises(doc: str, index: int, code: str) -> None:
    """The example executes without error and its printed lines start as its comments say."""
    buf = io.StringIO()
    module = types.ModuleType(f"doc_example_{index}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{doc}[{index}]", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    printed = buf.getvalue().splitlines()
    promises = [p.split(" — ", 1)[0].strip() for p in _PROMISE.findall(code)]
    assert len(printed) >= len(promises)
    for line, promise in zip(printed, promises, strict=False):
        assert line.startswith(promise), (line, promise)


@pytest.mark.parametrize(
    "module", ["timebound.policies._decorator", "timebound.telemetry.prometheus"]
)
def test_docstring_examples(module: str) -> None:
    """The examples in public docstrings pass as doctests."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0
    assert result.failed == 0
