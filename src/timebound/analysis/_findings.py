"""What the worst-case time check reports: findings with a stable code, a severity, a place, the
numbers and a fix (D14.1).

A :class:`Finding` is data: the code says what kind of contradiction it is (the table
:data:`CODES` is the one list, documented in docs/check.md), ``numbers`` carries the durations it
was computed from in milliseconds, and ``where`` says where it is written in the language of the
input (``file:line:col`` for a Constellation program, a JSON path for a JSON document, the
policy and its option for a Python policy). A :class:`Report` is the findings of one input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Final, Literal

from .._core._durations import format_duration

__all__ = ["CODES", "Code", "Finding", "Location", "Report", "Severity", "report_schema", "shown"]

Severity = Literal["error", "warning", "info"]
_RANK: Final = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, slots=True)
class Code:
    """One kind of finding: its stable code, its severity and a title."""

    code: str
    severity: Severity
    title: str


#: Every finding code, in the order of the table in docs/check.md. Codes never change meaning.
CODES: Final[Mapping[str, Code]] = {
    c.code: c
    for c in (
        Code("TB-T001", "error", "a retry that can never start, however fast attempts fail"),
        Code("TB-T002", "error", "a retry that never starts after timed-out attempts"),
        Code("TB-T003", "warning", "a retry that starts only when the jitter is small"),
        Code("TB-T004", "error", "an attempt timeout that the budget around it always cuts"),
        Code("TB-T005", "error", "a fallback with no time left to run after timed-out attempts"),
        Code("TB-T010", "error", "a node timeout that the workflow timeout always cuts"),
        Code("TB-T011", "error", "a synchronization timeout that the workflow timeout always cuts"),
        Code(
            "TB-T012",
            "warning",
            "a computed synchronization timeout that the workflow timeout cuts for large fan-outs",
        ),
        Code("TB-T013", "info", "a computed default synchronization timeout, with its inputs"),
        Code("TB-T020", "error", "a region whose deadline never comes before the caller's"),
        Code("TB-T021", "warning", "a region max_ms at or above the caller's budget"),
        Code("TB-T022", "error", "a task timeout that its region's deadline always cuts"),
        Code("TB-T030", "info", "the worst-case time of a composition"),
        Code("TB-T031", "warning", "a worst-case time above the caller's budget"),
        Code("TB-T032", "error", "a node reserve that the workflow's bound always refuses"),
        Code("TB-T033", "error", "a region reserve that leaves its success branch no time"),
        Code("TB-T034", "error", "a policy reserve that takes the caller's whole budget"),
    )
}


@dataclass(frozen=True, slots=True)
class Location:
    """Where a finding points: a file and line/column (Constellation, a Python policy's
    function), a JSON path (pipeline plans, workflow definitions) and the option concerned."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str | None = None
    parameter: str | None = None

    def __str__(self) -> str:
        out = self.file or ""
        if self.line is not None:
            out += f":{self.line}" + ("" if self.column is None else f":{self.column}")
        if self.path is not None:
            out += (": " if out else "") + self.path
        if self.parameter is not None:
            out += f" ({self.parameter})" if out else self.parameter
        return out or "<input>"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "parameter": self.parameter,
        }


def _ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds for the JSON output (``None``: unbounded or unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return round(seconds * 1000.0, 6)


def _count(value: float | int | None) -> float | int | None:
    """A count for JSON: past 2^53 (what a JSON reader holds exactly) as a float, or ``None``
    past what a float holds."""
    if not isinstance(value, int) or abs(value) < 2**53:
        return value
    try:
        return float(value)
    except OverflowError:
        return None


def shown(seconds: float | None) -> str:
    """A duration as people read it; ``None`` and infinity read ``unbounded``."""
    if seconds is None or not math.isfinite(seconds):
        return "unbounded"
    return format_duration(seconds)


@dataclass(frozen=True, slots=True)
class Finding:
    """One contradiction (or computed value) found before anything ran.

    ``subject`` names the composition (a policy, a call, a node, a region); ``numbers`` are
    durations in seconds keyed by what they are (``timeout``, ``budget``, ``needed``, …) and
    counts (``attempt``, ``attempts``, ``spawn_count``); ``fix`` suggests a change.
    """

    code: str
    subject: str
    message: str
    where: Location
    fix: str | None = None
    numbers: Mapping[str, float | int | None] = field(default_factory=dict)
    counts: frozenset[str] = frozenset()

    @property
    def severity(self) -> Severity:
        return CODES[self.code].severity

    def __str__(self) -> str:
        line = f"{self.where}: {self.severity} {self.code}: {self.message}"
        return line if self.fix is None else f"{line}\n    fix: {self.fix}"

    def to_json(self) -> dict[str, Any]:
        numbers: dict[str, float | int | None] = {}
        for name, value in self.numbers.items():
            if name in self.counts:
                numbers[name] = _count(value)
            else:
                numbers[f"{name}_ms"] = _ms(None if value is None else float(value))
        return {
            "code": self.code,
            "severity": self.severity,
            "subject": self.subject,
            "message": self.message,
            "where": self.where.to_json(),
            "location": str(self.where),
            "numbers": numbers,
            "fix": self.fix,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """The findings of one input (``kind``: ``policy``, ``constellation``, ``pipeline``,
    ``workflow``), most severe first, then in the order they were found."""

    kind: str
    source: str
    findings: tuple[Finding, ...]
    budget: float | None = None

    @classmethod
    def of(
        cls, kind: str, source: str, findings: list[Finding], budget: float | None = None
    ) -> Report:
        ordered = sorted(findings, key=lambda f: _RANK[f.severity])  # stable: found order kept
        return cls(kind, source, tuple(ordered), budget)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def ok(self) -> bool:
        """No error-level finding (warnings and information do not fail a check)."""
        return not self.errors

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source": self.source,
            "budget_ms": _ms(self.budget),
            "ok": self.ok,
            "counts": {
                s: sum(1 for f in self.findings if f.severity == s)
                for s in ("error", "warning", "info")
            },
            "findings": [f.to_json() for f in self.findings],
        }


@cache
def report_schema() -> dict[str, Any]:
    """The JSON Schema of :meth:`Report.to_json` and of ``timebound check --json``, as shipped
    in the package (``timebound/analysis/report.schema.json``)."""
    text = resources.files(__package__).joinpath("report.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded
