"""Durable storage shared by timebound's engines: workflow runs, deferred operations, the host's
stored definitions.

``open_store(url)`` picks the backend: ``sqlite:///path.db`` (embedded, WAL, one writer process;
``?synchronous=NORMAL`` trades power-loss durability for speed) or ``postgresql://…`` (many
workers on many machines; ``?schema=NAME`` selects a schema).

Engines on a store run their loop and hold their tasks with :func:`run_rounds`, :class:`Wake`
and :class:`Detached` (``_wake.py``, D12.1, D12.2).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from ._base import Store, StoreBusy, StoreError, Tx, wake_delay
from ._wake import Detached, Wake, run_rounds, sleep_until_set

__all__ = [
    "Detached",
    "Store",
    "StoreBusy",
    "StoreError",
    "Tx",
    "Wake",
    "open_store",
    "run_rounds",
    "sleep_until_set",
    "wake_delay",
]


def open_store(url: str) -> Store:
    """A store for ``url`` (not yet opened: ``await store.open()``)."""
    if not isinstance(url, str) or not url:
        raise StoreError(f"a store URL is a non-empty string, not {url!r}")
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "sqlite":
        from ._sqlite import SqliteStore

        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise StoreError(f"{url!r}: a SQLite URL names a file: sqlite:///path/to/runs.db")
        unknown = set(query) - {"synchronous"}
        if unknown:
            raise StoreError(f"{url!r}: unknown SQLite option(s) {', '.join(sorted(unknown))}")
        return SqliteStore(path, synchronous=query.get("synchronous", "FULL"), url=url)
    if parts.scheme in ("postgresql", "postgres"):
        from ._postgres import PostgresStore

        store: Store = PostgresStore(url)
        return store
    raise StoreError(f"{url!r}: unsupported store (use sqlite:///FILE or postgresql://…)")
