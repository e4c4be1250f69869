"""No loop in timebound waits with ``asyncio.wait_for`` (D12.1): on Python 3.11 it can swallow a
cancellation that arrives as the wait ends (cpython#86296), and whatever stops that loop then
waits for it for ever. Wait with ``asyncio.timeout`` around the awaitable (``_store/_wake.py``)."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "timebound"


def _uses_wait_for(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "wait_for":
            if isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            lines += [node.lineno for alias in node.names if alias.name == "wait_for"]
    return lines


def test_the_check_sees_both_spellings() -> None:
    assert _uses_wait_for("import asyncio\nasyncio.wait_for(x, 1)\n") == [2]
    assert _uses_wait_for("from asyncio import wait_for\n") == [1]
    assert _uses_wait_for("call.wait_for_ready\n") == []


def test_no_source_file_uses_asyncio_wait_for() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        for line in _uses_wait_for(path.read_text(encoding="utf-8"))
    ]
    assert not found, "asyncio.wait_for used at " + ", ".join(found)
