"""Deadline propagation for aiohttp clients, as a client middleware (aiohttp >= 3.12).

The public names of :mod:`timebound.propagation.http._aiohttp`, which holds the implementation
and its rules. See ``docs/propagation.md``.
"""

from __future__ import annotations

from .http._aiohttp import AttemptTimeout, DeadlineMiddleware

__all__ = ["AttemptTimeout", "DeadlineMiddleware"]
