"""How many of upstream Constellation's programs timebound accepts.

``programs.json`` holds every program of the upstream repository at one commit (MIT licence, see
``LICENSE`` here): its ``.cst`` files and the ``constellation`` code blocks of its Markdown
documentation. A program is *accepted* when it compiles against the standard library and the
application modules in ``modules.py`` (with the ``"redis"`` cache backend two programs name
registered: compiling never connects to it); a call of any other module is left unchecked (E009
is ignored, as ``timebound check`` does without ``--modules``): documentation snippets call
modules nobody wrote.

Left out of the share, as the issue asks:

- programs upstream itself rejects for a reason we can establish without upstream's compiler:
  no ``out`` declaration (upstream's parser requires one) and ``out`` followed by anything but a
  name (upstream's ``out`` takes an identifier);
- snippets of the streaming RFC (RFC-025), whose options timebound does not implement;
- the programs listed in ``upstream_rejects.json``, reviewed one by one against upstream's
  grammar and type checker, each with its reason: pseudo-code in prose (``if x then``,
  ``List[T]``, ``items.map(x => ...)``), snippets that use types, names or fields they never
  define, and mistakes the page itself shows as errors. Every listed program must still be
  rejected here (a test checks it), so the list cannot hide a program we start accepting.

The rest counts, including the programs upstream accepts and timebound refuses (see the report
in ``bench/results/dsl_corpus.json``).
"""

from __future__ import annotations

import json
import pathlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from timebound.dsl import CompileError, compile

from .modules import RedisCache, make_registry

HERE = pathlib.Path(__file__).parent
_OUT_LINE = re.compile(r"(?m)^[ \t]*out[ \t]+(\S+)")
_NAME = re.compile(r"[^\W\d]\w*(?:-\w+)*")


@dataclass
class Share:
    """The measurement: counts, and the first diagnostic of every program not accepted."""

    total: int = 0
    left_out: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)

    @property
    def counted(self) -> int:
        return self.total - sum(self.left_out.values())

    @property
    def share(self) -> float:
        return self.accepted / self.counted if self.counted else 0.0


def programs() -> list[dict[str, Any]]:
    data = json.loads((HERE / "programs.json").read_text(encoding="utf-8"))
    result: list[dict[str, Any]] = data["programs"]
    return result


def reviewed_rejects() -> dict[tuple[str, int | None], str]:
    """The reviewed programs upstream rejects too: (source, block) -> reason."""
    data = json.loads((HERE / "upstream_rejects.json").read_text(encoding="utf-8"))
    return {(d["source"], d["block"]): d["reason"] for d in data}


def left_out_because(program: dict[str, Any]) -> str | None:
    """Why a program is not counted (None: it counts)."""
    reviewed = _REVIEWED.get((program["source"], program["block"]))
    if reviewed is not None:
        return f"upstream rejects it too: {reviewed}"
    if "rfc-025" in program["source"]:
        return "streaming RFC-025"
    outs = _OUT_LINE.findall(program["text"])
    if not outs:
        return "no 'out' (upstream's parser requires one)"
    if any(not _NAME.fullmatch(o) for o in outs):
        return "'out' of an expression (upstream's 'out' takes a name)"
    return None


_REVIEWED = reviewed_rejects()
# Registered so that `cache_backend: "redis"` resolves; compiling does not use it.
_UNUSED_REDIS = RedisCache("redis://127.0.0.1:6379/0", "timebound-corpus-unused:")


def accepts(program: dict[str, Any]) -> str | None:
    """None when timebound accepts ``program``, else its first diagnostic."""
    try:
        compile(program["text"], modules=make_registry(_UNUSED_REDIS))
    except CompileError as exc:
        errors = [d for d in exc.diagnostics if d.severity == "error" and d.code != "E009"]
        if errors:
            return str(errors[0])
    return None


def measure() -> Share:
    result = Share()
    for program in programs():
        result.total += 1
        reason = left_out_because(program)
        if reason is not None:
            result.left_out[reason] += 1
            continue
        diagnostic = accepts(program)
        if diagnostic is None:
            result.accepted += 1
        else:
            result.rejected.append(
                {"source": program["source"], "block": program["block"], "diagnostic": diagnostic}
            )
    return result
