"""Where the budget went (DECISIONS D13): a small tree of the time between a bound's start and
its firing.

Recording is a *mark*: a tuple appended to the innermost deadline frame that exists anyway (a
``fail_*`` scope, an inherited request bound). Nothing is recorded outside every frame (no bound
could fire there), a frame holds at most :data:`MARKS_MAX` marks (later ones are summed into one
``more`` mark), and nothing is built until somebody reads :attr:`DeadlineExceeded.breakdown`: a
deadline that never fires costs the marks' appends and nothing else.

A mark is ``(kind, name, t0, t1, budget, outcome, sub)`` on the monotonic clock, where ``sub`` is
``None``, the marks of a nested frame (a list), or a :class:`Breakdown` received from another
service. Kinds: ``scope`` (a nested scope that recorded something), ``attempt``, ``backoff``,
``throttle``, ``concurrency``, ``queue`` (server admission), ``fallback``, ``call`` (an outgoing
call), ``remote`` (the callee's own breakdown of a call), ``self`` (the code of the frame
itself: the time no other part covers), ``late`` (from the bound's deadline to the moment it was
reported: the event loop or the process was busy elsewhere), ``more`` (parts summarised away).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any, Final

from ._durations import Duration, to_seconds
from ._errors import ConfigurationError

__all__ = ["BREAKDOWN_MAX_NODES", "MARKS_MAX", "Breakdown", "add_mark", "build"]

#: Marks one frame keeps; past it they are summed into one ``more`` mark.
MARKS_MAX: Final = 64
#: Nodes one built tree holds (the root included); past it siblings are summarised.
BREAKDOWN_MAX_NODES: Final = 48
#: Depth of a tree built or parsed (a remote tree nests inside a call node).
MAX_DEPTH: Final = 8

KINDS: Final = frozenset(
    (
        "bound",
        "scope",
        "attempt",
        "backoff",
        "throttle",
        "concurrency",
        "queue",
        "fallback",
        "call",
        "remote",
        "self",
        "late",
        "more",
        "state",
        "policy",
        "region",
        "node",
        "workflow",
        "deferred",
        "synchronization",
    )
)
_MAX_TEXT: Final = 120


class Breakdown:
    """One part of where a budget went, with its own parts.

    ``kind`` says what the part is (``attempt``, ``backoff``, ``call``, ``self``, …; the root is
    ``bound``), ``name`` what it was for (a policy's or a call's name), ``elapsed_ms`` how long it
    took, ``budget_ms`` the budget it was given when it had one, ``outcome`` how it ended (``ok``,
    ``timeout``, an error's type name). A part with ``parts`` is exactly covered by them: the
    time no child covers is a ``self`` part, so the children's ``elapsed_ms`` add up to the
    parent's (children that ran at the same time overlap and are marked ``parallel``).
    ``offset_ms`` is when the part started, after its parent's start.
    """

    __slots__ = ("budget_ms", "elapsed_ms", "kind", "name", "offset_ms", "outcome", "parts")

    kind: str
    name: str | None
    elapsed_ms: float
    budget_ms: float | None
    outcome: str | None
    offset_ms: float
    parts: tuple[Breakdown, ...]

    def __init__(
        self,
        kind: str,
        elapsed: Duration,
        *,
        name: str | None = None,
        budget: Duration | None = None,
        outcome: str | None = None,
        offset: Duration = 0.0,
        parts: tuple[Breakdown, ...] = (),
    ) -> None:
        """A part built by hand (timebound builds its own from the stored fields, in ms):
        ``elapsed``, ``budget`` and ``offset`` are durations (seconds, a ``timedelta``,
        ``"250ms"``)."""
        if kind not in KINDS:
            raise ConfigurationError(f"unknown breakdown kind {kind!r}", option="kind")
        self.kind = kind
        self.name = name
        self.elapsed_ms = to_seconds(elapsed, option="elapsed") * 1000.0
        self.budget_ms = None if budget is None else to_seconds(budget, option="budget") * 1000.0
        self.outcome = outcome
        self.offset_ms = to_seconds(offset, option="offset") * 1000.0
        self.parts = tuple(parts)

    # Reading ---------------------------------------------------------------------------

    def walk(self, depth: int = 0) -> Iterator[tuple[int, Breakdown]]:
        """Every part with its depth, this one first (depth first, in order)."""
        yield depth, self
        for p in self.parts:
            yield from p.walk(depth + 1)

    def __len__(self) -> int:
        return sum(1 for _ in self.walk())

    def label(self) -> str:
        text = self.kind if self.name is None else f"{self.kind} {self.name}"
        if self.outcome is not None and self.kind not in ("self", "more", "bound"):
            text += f" ({self.outcome})"
        return text

    def biggest(self, n: int = 3) -> list[Breakdown]:
        """The ``n`` largest leaf parts, largest first (what a one-line summary names)."""
        leaves = [p for _, p in self.walk() if not p.parts and p is not self]
        leaves.sort(key=lambda p: -p.elapsed_ms)
        return leaves[:n]

    def summary(self, n: int = 3) -> str:
        """One line: the elapsed time and the ``n`` biggest parts, the parts of one kind and
        name summed (``attempt fetch x4 330ms``); ``str()`` of an error shows it."""
        groups: dict[tuple[str, str | None], list[float]] = {}
        for _, p in self.walk():
            if p.parts or p is self:
                continue
            g = groups.setdefault((p.kind, p.name), [0.0, 0.0])
            g[0] += p.elapsed_ms
            g[1] += 1
        top = sorted((kv for kv in groups.items() if kv[1][0] > 0), key=lambda kv: -kv[1][0])[:n]
        parts = ", ".join(
            f"{kind if name is None else f'{kind} {name}'}{'' if count == 1 else f' x{count:.0f}'}"
            f" {_ms(total)}"
            for (kind, name), (total, count) in top
        )
        return f"{_ms(self.elapsed_ms)} went to: {parts}" if parts else _ms(self.elapsed_ms)

    def render(self) -> str:
        """The whole tree as indented lines (``timebound run --trace`` prints this)."""
        lines = []
        for depth, p in self.walk():
            budget = "" if p.budget_ms is None else f" of {_ms(p.budget_ms)}"
            at = "" if depth == 0 or p.kind in ("self", "more") else f"  +{_ms(p.offset_ms)}"
            lines.append(f"{'  ' * depth}{p.label()}: {_ms(p.elapsed_ms)}{budget}{at}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Breakdown {self.label()} {_ms(self.elapsed_ms)}, {len(self)} parts>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Breakdown):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    # The wire and storage form -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (short keys: it travels in a header and is stored with rows)."""
        d: dict[str, Any] = {"k": self.kind, "ms": round(self.elapsed_ms, 3)}
        if self.name is not None:
            d["n"] = self.name
        if self.budget_ms is not None:
            d["b"] = round(self.budget_ms, 3)
        if self.outcome is not None:
            d["o"] = self.outcome
        if self.offset_ms:
            d["at"] = round(self.offset_ms, 3)
        if self.parts:
            d["p"] = [p.to_dict() for p in self.parts]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=True)

    @classmethod
    def from_dict(cls, data: Any, *, max_nodes: int = 256) -> Breakdown:
        """Parse the :meth:`to_dict` form strictly; ``ValueError`` says what was wrong.

        Unknown keys, unknown kinds, wrong types, negative or non-finite numbers, texts over 120
        characters, more than ``max_nodes`` nodes or a depth over 8 are refused.
        """
        count = [0]
        return _parse(data, count, max_nodes, 0, "$")

    @classmethod
    def from_json(cls, text: str | bytes, *, max_bytes: int = 4096) -> Breakdown:
        if len(text) > max_bytes:
            raise ValueError(f"breakdown of {len(text)} bytes is over the {max_bytes}-byte limit")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"breakdown is not JSON: {exc}") from None
        return cls.from_dict(data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_dict, (self.to_dict(),))

    def capped(self, max_bytes: int) -> str | None:
        """The compact JSON of this tree in at most ``max_bytes``, summarising deeper and
        smaller parts until it fits; ``None`` when not even the root fits."""
        for nodes in (BREAKDOWN_MAX_NODES, 24, 12, 6, 3, 1):
            text = summarised(self, nodes).to_json()
            if len(text) <= max_bytes:
                return text
        return None


def _mk(
    kind: str,
    elapsed_ms: float,
    *,
    name: str | None = None,
    budget_ms: float | None = None,
    outcome: str | None = None,
    offset_ms: float = 0.0,
    parts: tuple[Breakdown, ...] = (),
) -> Breakdown:
    """A part with its fields as stored (ms), without the public constructor's conversions."""
    b: Breakdown = object.__new__(Breakdown)
    b.kind = kind
    b.name = name
    b.elapsed_ms = elapsed_ms
    b.budget_ms = budget_ms
    b.outcome = outcome
    b.offset_ms = offset_ms
    b.parts = parts
    return b


def _from_dict(d: dict[str, Any]) -> Breakdown:
    return Breakdown.from_dict(d, max_nodes=1 << 30)


_KEYS: Final = frozenset(("k", "ms", "n", "b", "o", "at", "p"))


def _num(v: Any, where: str) -> float:
    if type(v) is int:
        ok = 0 <= v <= 10**12
    else:
        ok = type(v) is float and math.isfinite(v) and 0 <= v <= 1e12
    if not ok:
        raise ValueError(f"{where}: expected a finite non-negative number, got {v!r:.40}")
    return float(v)


def _text(v: Any, where: str) -> str:
    if type(v) is not str or len(v) > _MAX_TEXT or not v.isprintable():
        raise ValueError(f"{where}: expected a printable text of at most {_MAX_TEXT} characters")
    return v


def _parse(data: Any, count: list[int], max_nodes: int, depth: int, where: str) -> Breakdown:
    if type(data) is not dict:
        raise ValueError(f"{where}: expected an object")
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH}")
    count[0] += 1
    if count[0] > max_nodes:
        raise ValueError(f"{where}: more than {max_nodes} parts")
    extra = data.keys() - _KEYS
    if extra:
        raise ValueError(f"{where}: unknown key {sorted(extra)[0]!r:.40}")
    kind = data.get("k")
    if type(kind) is not str or kind not in KINDS:
        raise ValueError(f"{where}.k: unknown kind {kind!r:.40}")
    if "ms" not in data:
        raise ValueError(f"{where}: no 'ms'")
    elapsed = _num(data["ms"], f"{where}.ms")
    name = _text(data["n"], f"{where}.n") if "n" in data else None
    budget = _num(data["b"], f"{where}.b") if "b" in data else None
    outcome = _text(data["o"], f"{where}.o") if "o" in data else None
    offset = _num(data["at"], f"{where}.at") if "at" in data else 0.0
    parts: tuple[Breakdown, ...] = ()
    if "p" in data:
        raw = data["p"]
        if type(raw) is not list:
            raise ValueError(f"{where}.p: expected a list")
        parts = tuple(
            _parse(p, count, max_nodes, depth + 1, f"{where}.p[{i}]") for i, p in enumerate(raw)
        )
    return _mk(
        str(kind),
        elapsed,
        name=name,
        budget_ms=budget,
        outcome=outcome,
        offset_ms=offset,
        parts=parts,
    )


def _ms(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:.3g}s"
    if v >= 10 or v == 0:
        return f"{v:.0f}ms"
    return f"{v:.2g}ms"


# Recording ---------------------------------------------------------------------------------

Mark = tuple[str, "str | None", float, float, "float | None", "str | None", Any]


def add_mark(frame: Any, mark: Mark) -> None:
    """Append ``mark`` to ``frame``'s marks (summing past :data:`MARKS_MAX` into ``more``)."""
    marks = frame._marks
    if marks is None:
        frame._marks = [mark]
        return
    n = len(marks)
    if n < MARKS_MAX - 1:
        marks.append(mark)
        return
    # The last slot sums everything past the cap: count in ``outcome``, time in ``budget``.
    if n == MARKS_MAX - 1:
        marks.append(("more", None, mark[2], mark[3], mark[3] - mark[2], "1", None))
        return
    last = marks[-1]
    marks[-1] = (
        "more",
        None,
        min(last[2], mark[2]),
        max(last[3], mark[3]),
        (last[4] or 0.0) + (mark[3] - mark[2]),
        str(int(last[5] or "0") + 1),
        None,
    )


# Building ----------------------------------------------------------------------------------


def build(
    kind: str,
    name: str | None,
    t0: float,
    t_end: float,
    budget: float | None,
    outcome: str | None,
    marks: list[Mark] | None,
    n_marks: int,
    open_frames: list[Any] = (),  # type: ignore[assignment]
    deadline: float | None = None,
) -> Breakdown:
    """The tree of a frame that started at ``t0`` and fired at ``t_end``.

    ``marks[:n_marks]`` are its finished parts; ``open_frames`` are nested frames still entered
    when it fired (innermost last), each shown as a part that ran to ``t_end``. With the frame's
    ``deadline`` passed before ``t_end`` (a timer that fired late, a task that got the loop late),
    the parts end at the deadline and the rest is one ``late`` part (D13.9).
    """
    parts: list[Any] = list(marks[:n_marks]) if marks else []
    nested: Any = None
    for f in reversed(open_frames):  # innermost first: each is a part of the next one out
        sub = list(f._marks or ())
        if nested is not None:
            sub.append(nested)
        nested = ("scope", f._what, _frame_start(f, t_end), t_end, f._timeout, "cut", sub)
    if nested is not None:
        parts.append(nested)
    due = t_end if deadline is None or not t0 <= deadline < t_end else deadline
    root = _node(kind, name, t0, due, budget, outcome, parts, t0, 0)
    if not root.parts:
        # Nothing recorded: all of it was the bound's own code (a root always has its parts).
        root = _with_parts(root, (_mk("self", root.elapsed_ms),))
    if due < t_end:
        late = _mk("late", (t_end - due) * 1000.0, offset_ms=root.elapsed_ms)
        root = _mk(
            kind,
            root.elapsed_ms + late.elapsed_ms,
            name=name,
            budget_ms=root.budget_ms,
            outcome=root.outcome,
            parts=(*root.parts, late),
        )
    return summarised(root, BREAKDOWN_MAX_NODES)


def _frame_start(f: Any, fallback: float) -> float:
    t0 = getattr(f, "_t0", None)
    if t0 is not None:
        return float(t0)
    timeout = f._timeout
    if timeout is not None and math.isfinite(timeout) and math.isfinite(f._own):
        return float(f._own - timeout)
    return fallback


def _node(
    kind: str,
    name: str | None,
    t0: float,
    t1: float,
    budget: float | None,
    outcome: str | None,
    sub: Any,
    parent_t0: float,
    depth: int,
) -> Breakdown:
    elapsed_ms = max(0.0, (t1 - t0) * 1000.0)
    budget_ms = None if budget is None or not math.isfinite(budget) else budget * 1000.0
    offset_ms = max(0.0, (t0 - parent_t0) * 1000.0)
    if isinstance(sub, Breakdown):
        # A callee's own tree: it is the part of this call spent on the far side; the rest of
        # the call (the network, queues, serialisation) is this side's ``self``.
        remote = _rescaled(sub, elapsed_ms)
        children = (remote, _mk("self", max(0.0, elapsed_ms - remote.elapsed_ms)))
        return _mk(
            kind,
            elapsed_ms,
            name=name,
            budget_ms=budget_ms,
            outcome=outcome,
            offset_ms=offset_ms,
            parts=children,
        )
    if not sub or depth >= MAX_DEPTH:
        return _mk(
            kind, elapsed_ms, name=name, budget_ms=budget_ms, outcome=outcome, offset_ms=offset_ms
        )
    kids: list[Breakdown] = []
    covered = 0.0
    reach = t0
    parallel = False
    for m in sorted(sub, key=lambda m: m[2]):
        mk, mn, m0, m1, mb, mo, ms = m
        # Clip to this part: a mark that outlived the firing counts up to it.
        c0 = max(m0, t0)
        c1 = min(m1, t1)
        if c1 <= c0 and not (m0 == m1 and t0 <= m0 <= t1):
            continue
        if mk == "more":
            # Summed marks: count in outcome, time in budget (see add_mark).
            kids.append(
                _mk(
                    "more",
                    (mb or 0.0) * 1000.0,
                    name=f"{mo} more parts",
                    offset_ms=max(0.0, (c0 - t0) * 1000.0),
                )
            )
            covered += (mb or 0.0) * 1000.0
            reach = max(reach, c1)
            continue
        if c0 < reach:
            parallel = True
            # Only the part past what earlier siblings covered is new time.
            if c1 > reach:
                covered += (c1 - reach) * 1000.0
                reach = c1
        else:
            covered += (c1 - c0) * 1000.0
            reach = c1
        kids.append(_node(mk, mn, c0, c1, mb, mo, ms, t0, depth + 1))
    self_ms = max(0.0, elapsed_ms - covered)
    if kids:
        kids.append(_mk("self", self_ms))
    if parallel:
        outcome = f"{outcome}, parallel" if outcome else "parallel"
    return _mk(
        kind,
        elapsed_ms,
        name=name,
        budget_ms=budget_ms,
        outcome=outcome,
        offset_ms=offset_ms,
        parts=tuple(kids),
    )


def _rescaled(remote: Breakdown, limit_ms: float) -> Breakdown:
    """A callee's tree as a ``remote`` part, never longer than the call that carried it."""
    elapsed = min(remote.elapsed_ms, limit_ms)
    return _mk(
        "remote",
        elapsed,
        name=remote.name,
        budget_ms=remote.budget_ms,
        outcome=remote.outcome,
        offset_ms=0.0,
        parts=remote.parts if elapsed == remote.elapsed_ms else _trim(remote.parts, elapsed),
    )


def _trim(parts: tuple[Breakdown, ...], limit_ms: float) -> tuple[Breakdown, ...]:
    # The callee counted more time than the caller saw (clock rates, rounding): keep the tree's
    # shape but let the parts still add up to what the caller saw.
    total = sum(p.elapsed_ms for p in parts) or 1.0
    k = limit_ms / total
    return tuple(_scaled(p, k) for p in parts)


def _scaled(p: Breakdown, k: float) -> Breakdown:
    return _mk(
        p.kind,
        p.elapsed_ms * k,
        name=p.name,
        budget_ms=p.budget_ms,
        outcome=p.outcome,
        offset_ms=p.offset_ms * k,
        parts=tuple(_scaled(c, k) for c in p.parts),
    )


def summarised(root: Breakdown, max_nodes: int) -> Breakdown:
    """``root`` with at most ``max_nodes`` nodes: breadth first, each part keeps its children
    while the budget lasts; the siblings that do not fit become one ``more`` part (their summed
    time), so every level still adds up."""
    if max_nodes < 1:
        max_nodes = 1
    if len(root) <= max_nodes:
        return root
    left = [max_nodes - 1]
    return _cut(root, left)


def _cut(p: Breakdown, left: list[int]) -> Breakdown:
    if not p.parts:
        return p
    if left[0] <= 0:
        return _leaf(p)
    # Keep the largest parts (and the ``self``) first; one slot is kept for ``more``.
    order = sorted(range(len(p.parts)), key=lambda i: -p.parts[i].elapsed_ms)
    keep: set[int] = set()
    room = left[0]
    for i in order:
        if len(keep) + 1 >= room and len(keep) + 1 < len(p.parts):
            break
        keep.add(i)
    left[0] -= len(keep)
    dropped = [p.parts[i] for i in range(len(p.parts)) if i not in keep]
    kids = [p.parts[i] for i in sorted(keep)]
    if dropped:
        left[0] -= 1
        kids.append(
            _mk("more", sum(d.elapsed_ms for d in dropped), name=f"{len(dropped)} more parts")
        )
    kids = [_cut(k, left) if k.parts else k for k in kids]
    return _with_parts(p, tuple(kids))


def _leaf(p: Breakdown) -> Breakdown:
    return _with_parts(p, ())


def _with_parts(p: Breakdown, parts: tuple[Breakdown, ...]) -> Breakdown:
    return _mk(
        p.kind,
        p.elapsed_ms,
        name=p.name,
        budget_ms=p.budget_ms,
        outcome=p.outcome,
        offset_ms=p.offset_ms,
        parts=parts,
    )


def as_breakdown(value: Any) -> Breakdown | None:
    """A stored breakdown (dict) back as a tree; ``None`` for anything else or a malformed one."""
    if isinstance(value, Breakdown):
        return value
    if isinstance(value, Mapping):
        try:
            return Breakdown.from_dict(dict(value))
        except ValueError:
            return None
    return None
