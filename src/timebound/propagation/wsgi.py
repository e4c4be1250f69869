"""Deadline propagation and admission control for WSGI servers (DECISIONS D4, D9).

The public names of :mod:`timebound.propagation.http._wsgi`, which holds the implementation
and its rules. See ``docs/propagation.md``.
"""

from __future__ import annotations

from .http._wsgi import AdmissionMiddleware, DeadlineMiddleware

__all__ = ["AdmissionMiddleware", "DeadlineMiddleware"]
