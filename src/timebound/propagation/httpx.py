"""Deadline propagation for httpx clients (DECISIONS D4.3, D4.5, D4.8).

The public names of :mod:`timebound.propagation.http._httpx`, which holds the implementation
and its rules. See ``docs/propagation.md``.
"""

from __future__ import annotations

from .http._httpx import AsyncDeadlineTransport, AttemptTimeout, DeadlineTransport

__all__ = ["AsyncDeadlineTransport", "AttemptTimeout", "DeadlineTransport"]
