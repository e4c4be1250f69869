"""Deadline propagation for requests (DECISIONS D4.3, D4.5, D4.8).

The public names of :mod:`timebound.propagation.http._requests`, which holds the implementation
and its rules. See ``docs/propagation.md``.
"""

from __future__ import annotations

from .http._requests import AttemptTimeout, DeadlineAdapter

__all__ = ["AttemptTimeout", "DeadlineAdapter"]
