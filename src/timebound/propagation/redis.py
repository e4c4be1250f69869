"""Deadline propagation for redis-py, sync and asyncio (DECISIONS D4.8). See ``docs/databases.md``.

``connection_class=DeadlineConnection`` (``AsyncDeadlineConnection``): a command fails fast when
the deadline has passed, and its reply is awaited no longer than the time left. A command is
never cancelled mid-flight (redis-py#2624, CVE-2023-28858/28859): a connection whose reply may
still arrive is closed, never reused. Needs ``pip install 'timebound[redis]'``.
"""

from __future__ import annotations

from .db._redis import AsyncDeadlineConnection, DeadlineConnection, afrom_url, from_url

__all__ = ["AsyncDeadlineConnection", "DeadlineConnection", "afrom_url", "from_url"]
