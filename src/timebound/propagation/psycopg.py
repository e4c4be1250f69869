"""Deadline propagation for psycopg 3, sync and async (DECISIONS D4.8). See ``docs/databases.md``.

``cursor_factory=DeadlineCursor`` (``AsyncDeadlineCursor``) makes every ``execute`` obey the
current deadline: fail fast when it has passed, and let PostgreSQL cancel the statement at the
deadline through a narrowed ``statement_timeout`` (SQLSTATE 57014 →
:class:`~timebound.DeadlineExceeded`). ``connection(pool)``/``aconnection(pool)`` cap the wait for
a pooled connection. Needs ``pip install 'timebound[postgres]'``.
"""

from __future__ import annotations

from .db._psycopg import (
    AsyncDeadlineCursor,
    DeadlineCursor,
    aconnect,
    aconnection,
    connect,
    connection,
)

__all__ = [
    "AsyncDeadlineCursor",
    "DeadlineCursor",
    "aconnect",
    "aconnection",
    "connect",
    "connection",
]
