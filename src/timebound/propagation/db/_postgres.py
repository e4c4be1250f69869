"""PostgreSQL statement-timeout narrowing shared by the asyncpg and psycopg adapters.

The deadline travels *into* the query as ``statement_timeout`` so that PostgreSQL cancels the
statement itself at the deadline (SQLSTATE 57014): no client-side cancel, whose CancelRequest
opens a second connection (costly under overload), and a sync driver is bounded too.

It is set with ``set_config(..., is_local => true)`` — ``SET LOCAL`` — so it ends with the
transaction and never lingers on a pooled connection. It only ever *narrows*: a session or role
``statement_timeout`` shorter than the time left stays in force (and a cancel it causes is not
ours to report). Inside a caller's transaction the previous value is put back after the
statement, so the caller's later statements run under their own setting.

Outside a transaction the statement gets one of its own, opened and narrowed in a single
simple-query message (:func:`begin_narrowed`), so the bookkeeping costs two round trips
(``BEGIN``+narrowing, ``COMMIT``) rather than three.
"""

from __future__ import annotations

from typing import Final

#: SQLSTATE of a statement cancelled by ``statement_timeout`` (query_canceled).
QUERY_CANCELED: Final = "57014"

# The setting in force, in ms. ``current_setting`` is cheap (the ``pg_settings`` view builds
# every row and cost ~0.5 ms a call); its text (``0``, ``250ms``, ``5s``, ``1min``, ``1h``,
# ``1d``) is valid interval input.
_IN_FORCE = "(extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::bigint"


def begin_narrowed(ms: int) -> str:
    """``BEGIN`` and narrowing to ``ms``, one simple-query message (no parameters possible, so
    the integer is written in; it is ours, never the caller's text).

    Its command tag says whether our value rules: ``SELECT 1`` when it was set, ``SELECT 0``
    when a tighter setting stays in force.
    """
    ms = int(ms)
    return (
        f"BEGIN; SELECT set_config('statement_timeout', '{ms}', true) "
        f"FROM (SELECT {_IN_FORCE} AS prev) AS s WHERE prev = 0 OR prev >= {ms}"
    )


# One round trip: read the value in force (the FROM subquery runs before ``set_config``), narrow
# it for this transaction, and say whether ours now rules.
_NARROW = (
    "SELECT prev::text, "
    "set_config('statement_timeout', "
    "CASE WHEN prev = 0 OR prev > {ms}::bigint THEN {ms}::bigint::text ELSE prev::text END, "
    "true) IS NOT NULL AND (prev = 0 OR prev >= {ms}::bigint) "
    f"FROM (SELECT {_IN_FORCE} AS prev) AS s"
)

#: Narrow to ``$1`` ms; returns ``(previous ms as text, whether our value is in force)``.
NARROW_ASYNCPG: Final = _NARROW.format(ms="$1")
#: The same for psycopg (named parameter ``ms``).
NARROW_PSYCOPG: Final = _NARROW.format(ms="%(ms)s")
# Put the previous value back for the rest of the caller's transaction — unless the statement
# itself changed the setting (``SET LOCAL statement_timeout = …``), which then stands.
_RESTORE = (
    f"SELECT set_config('statement_timeout', {{prev}}, true) WHERE {_IN_FORCE} = {{ms}}::bigint"
)

#: Restore ``$1`` (previous ms as text) if ``$2`` ms is still in force (asyncpg).
RESTORE_ASYNCPG: Final = _RESTORE.format(prev="$1", ms="$2")
#: The same for psycopg (named parameters ``prev`` and ``ms``).
RESTORE_PSYCOPG: Final = _RESTORE.format(prev="%(prev)s", ms="%(ms)s")
