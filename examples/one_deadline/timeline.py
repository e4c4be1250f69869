"""The one timeline every part of the showcase writes to.

Each line is ``+ offset  lane  text``: the offset is measured from the moment the request was
sent, on the event loop's clock (the clock every deadline here is measured on), and the lane says
which part of the system wrote it.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Line:
    """One timeline entry."""

    at_ms: float
    lane: str
    text: str


@dataclass
class Timeline:
    """Collects lines (and prints them as they come, when ``out`` is given)."""

    out: TextIO | None = sys.stdout
    lines: list[Line] = field(default_factory=list)
    # Every bound of the run, by name: True when it fired, False when it was met.
    bounds: dict[str, bool] = field(default_factory=dict)
    start: float = 0.0

    def begin(self) -> None:
        self.start = asyncio.get_running_loop().time()

    def say(self, lane: str, text: str) -> None:
        at_ms = (asyncio.get_running_loop().time() - self.start) * 1000
        self.lines.append(Line(at_ms, lane, text))
        if self.out is not None:
            print(f"  +{at_ms:7.1f} ms  {lane:<10} {text}", file=self.out, flush=True)

    def bound(self, lane: str, name: str, *, fired: bool) -> None:
        """Record (and print) whether one bound fired or was met."""
        self.bounds[name] = fired
        self.say(lane, f"bound {name}: {'FIRED' if fired else 'met'}")

    def text(self) -> str:
        return "\n".join(f"{line.lane} {line.text}" for line in self.lines)
