"""Deadline propagation to databases: PostgreSQL (asyncpg, psycopg) and Redis.

:mod:`._common` guards one query (fail fast, bounded wait, settle a cancelled exchange),
:mod:`._postgres` narrows ``statement_timeout`` for both PostgreSQL drivers, and each driver has
its module. Users import them by their public names, :mod:`timebound.propagation.asyncpg`,
:mod:`timebound.propagation.psycopg` and :mod:`timebound.propagation.redis`.
"""

__all__: list[str] = []  # a room: its names are public through the modules beside it
