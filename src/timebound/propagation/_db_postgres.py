"""PostgreSQL statement-timeout narrowing shared by the asyncpg and psycopg adapters.

The deadline travels *into* the query as ``statement_timeout`` so that PostgreSQL cancels the
statement itself at the deadline (SQLSTATE 57014): no client-side cancel, whose CancelRequest
opens a second connection (costly under overload), and a sync driver is bounded too.

It is set with ``set_config(..., is_local => true)`` — ``SET LOCAL`` — so it ends with the
transaction and never lingers on a pooled connection. It only ever *narrows*: a session or role
``statement_timeout`` shorter than the time left stays in force (and a cancel it causes is not
ours to report). Inside a caller's transaction the previous value is put back after the
statement, so the caller's later statements run under their own setting.
"""

from __future__ import annotations

from typing import Final

#: SQLSTATE of a statement cancelled by ``statement_timeout`` (query_canceled).
QUERY_CANCELED: Final = "57014"

# One round trip: read the value in force (``pg_settings.setting`` is in ms; the row is read
# before ``set_config`` runs), narrow it for this transaction, and say whether ours now rules.
_NARROW = (
    "SELECT setting, "
    "set_config('statement_timeout', "
    "CASE WHEN setting::bigint = 0 OR setting::bigint > {ms}::bigint "
    "THEN {ms}::bigint::text ELSE setting END, true) IS NOT NULL "
    "AND (setting::bigint = 0 OR setting::bigint >= {ms}::bigint) "
    "FROM pg_settings WHERE name = 'statement_timeout'"
)

#: Narrow to ``$1`` ms; returns ``(previous ms as text, whether our value is in force)``.
NARROW_ASYNCPG: Final = _NARROW.format(ms="$1")
#: The same for psycopg (named parameter ``ms``).
NARROW_PSYCOPG: Final = _NARROW.format(ms="%(ms)s")
# Put the previous value back for the rest of the caller's transaction — unless the statement
# itself changed the setting (``SET LOCAL statement_timeout = …``), which then stands.
_RESTORE = (
    "SELECT set_config('statement_timeout', {prev}, true) FROM pg_settings "
    "WHERE name = 'statement_timeout' AND setting::bigint = {ms}::bigint"
)

#: Restore ``$1`` (previous ms as text) if ``$2`` ms is still in force (asyncpg).
RESTORE_ASYNCPG: Final = _RESTORE.format(prev="$1", ms="$2")
#: The same for psycopg (named parameters ``prev`` and ``ms``).
RESTORE_PSYCOPG: Final = _RESTORE.format(prev="%(prev)s", ms="%(ms)s")
