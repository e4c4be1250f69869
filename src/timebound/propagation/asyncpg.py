"""Deadline propagation for asyncpg (DECISIONS D4.8). See ``docs/databases.md``.

``connection_class=DeadlineConnection`` makes every query obey the current deadline: fail fast
when it has passed, and let PostgreSQL cancel the statement at the deadline through a narrowed
``statement_timeout`` (SQLSTATE 57014 → :class:`~timebound.DeadlineExceeded`). ``DeadlinePool``
caps the wait for a free connection. Needs ``pip install 'timebound[postgres]'``.
"""

from __future__ import annotations

from .db._asyncpg import DeadlineConnection, DeadlinePool, connect, create_pool

__all__ = ["DeadlineConnection", "DeadlinePool", "connect", "create_pool"]
