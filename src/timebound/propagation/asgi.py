"""Deadline propagation and admission control for ASGI servers (DECISIONS D4, D9).

The public names of :mod:`timebound.propagation.http._asgi`, which holds the implementation
and its rules. See ``docs/propagation.md``.
"""

from __future__ import annotations

from .http._asgi import AdmissionMiddleware, DeadlineMiddleware

__all__ = ["AdmissionMiddleware", "DeadlineMiddleware"]
