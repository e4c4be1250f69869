"""One migration history for every durable engine, on SQLite and PostgreSQL alike.

Each migration is a list of statements written once; ``{serial}`` and ``{bigint}`` are the only
dialect differences. Times are absolute epoch milliseconds written by the engine (D1.10, D6.12),
never a database clock, so both stores compare the same numbers.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "render"]

_DIALECT = {
    "sqlite": {
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "bigint": "INTEGER",
        "j_type": "json_extract(data, '$.timeout_type')",
        "j_policy": "json_extract(data, '$.policy_applied')",
        "j_lag": "json_extract(data, '$.detection_lag_ms')",
    },
    "postgres": {
        "serial": "BIGSERIAL PRIMARY KEY",
        "bigint": "BIGINT",
        "j_type": "(data::json ->> 'timeout_type')",
        "j_policy": "(data::json ->> 'policy_applied')",
        "j_lag": "(data::json ->> 'detection_lag_ms')::bigint",
    },
}

# The tallies' backfill (in the migration that creates tb_tallies): the timeout events already
# stored, as workflow/_metrics.py tallies them from then on (layer by timeout_type; lag buckets
# by their upper bound in ms).
_LAYER = (
    "CASE {j_type} WHEN 'workflow' THEN 'workflow' WHEN 'execution' THEN 'node' "
    "WHEN 'synchronization' THEN 'synchronization' ELSE 'other' END"
)
_BUCKET = (
    "CASE "
    + " ".join(
        f"WHEN lag <= {ms} THEN '{ms}'"
        for ms in (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000)
    )
    + " ELSE 'inf' END"
)
# D6.17: a fan-in timeout counts once, as its join's event, not again for each sibling it timed
# out (their token_timed_out events carry timeout_type synchronization).
_TIMEOUT_EVENTS = (
    "FROM tb_events WHERE kind = 'join_timed_out' OR (kind = 'token_timed_out' "
    "AND COALESCE({j_type}, '') <> 'synchronization')"
)

#: (version, statements). Append only: a released migration is never edited.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            # Engine-neutral: durable timers (one row per armed deadline, keyed by what it
            # guards) and an append-only event log per stream.
            """CREATE TABLE tb_timers (
                key TEXT PRIMARY KEY,
                kind TEXT NOT NULL,
                stream TEXT NOT NULL,
                due_ms {bigint} NOT NULL,
                priority INTEGER NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX tb_timers_due ON tb_timers (due_ms, priority)",
            """CREATE TABLE tb_events (
                seq {serial},
                stream TEXT NOT NULL,
                kind TEXT NOT NULL,
                at_ms {bigint} NOT NULL,
                data TEXT NOT NULL
            )""",
            "CREATE INDEX tb_events_stream ON tb_events (stream, seq)",
            # Workflows.
            """CREATE TABLE tb_wf_definitions (
                id TEXT NOT NULL,
                version INTEGER NOT NULL,
                body TEXT NOT NULL,
                PRIMARY KEY (id, version)
            )""",
            """CREATE TABLE tb_wf_runs (
                id TEXT PRIMARY KEY,
                definition_id TEXT NOT NULL,
                definition_version INTEGER NOT NULL,
                status TEXT NOT NULL,
                input TEXT NOT NULL,
                state TEXT NOT NULL,
                started_at {bigint} NOT NULL,
                timeout_at {bigint},
                finished_at {bigint},
                error TEXT,
                parent_token_id TEXT,
                inherited_deadline_at {bigint}
            )""",
            "CREATE INDEX tb_wf_runs_parent ON tb_wf_runs (parent_token_id)",
            """CREATE TABLE tb_wf_tokens (
                id TEXT PRIMARY KEY,
                run_id TEXT NOT NULL,
                node_id TEXT NOT NULL,
                status TEXT NOT NULL,
                seq {bigint} NOT NULL,
                branch_index INTEGER,
                branch_total INTEGER,
                branch_item TEXT,
                branch_output TEXT,
                fan_out_transition_id TEXT,
                group_key TEXT,
                outer_branch TEXT,
                lineage TEXT NOT NULL,
                child_run_id TEXT,
                retry_count INTEGER NOT NULL DEFAULT 0,
                attempt INTEGER NOT NULL DEFAULT 0,
                timeout_at {bigint},
                not_before {bigint} NOT NULL,
                state_data TEXT NOT NULL,
                output TEXT,
                error TEXT,
                lease_owner TEXT,
                lease_until {bigint},
                created_at {bigint} NOT NULL,
                updated_at {bigint} NOT NULL
            )""",
            "CREATE INDEX tb_wf_tokens_run ON tb_wf_tokens (run_id, seq)",
            "CREATE INDEX tb_wf_tokens_ready ON tb_wf_tokens (status, not_before)",
            # One row per fan-in instance: a join transition for one fan-out's siblings.
            """CREATE TABLE tb_wf_joins (
                run_id TEXT NOT NULL,
                transition_id TEXT NOT NULL,
                group_key TEXT NOT NULL,
                spawned INTEGER NOT NULL,
                sync_started_at {bigint},
                timeout_at {bigint},
                decided INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (run_id, transition_id, group_key)
            )""",
        ),
    ),
    (
        2,
        (
            # Deferred operations (D7): one row per operation, keyed by its operation/id. Private
            # content (continuation, result) lives only in this row; history keeps digests.
            """CREATE TABLE tb_deferred_ops (
                id TEXT PRIMARY KEY,
                kind TEXT NOT NULL,
                module TEXT,
                status TEXT NOT NULL,
                created_ms {bigint} NOT NULL,
                updated_ms {bigint} NOT NULL,
                expires_ms {bigint} NOT NULL,
                connector_updated_ms {bigint},
                next_poll_ms {bigint},
                retry_after_s INTEGER NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                status_href TEXT,
                cancel_href TEXT,
                cancel_reason TEXT,
                cancel_requested_ms {bigint},
                correlation_id TEXT,
                idem_digest TEXT UNIQUE,
                request_digest TEXT,
                continuation TEXT,
                continuation_digest TEXT,
                resumed_ms {bigint},
                resume_error TEXT,
                last_error_code TEXT,
                error TEXT,
                result TEXT,
                result_digest TEXT,
                late_result_digest TEXT,
                status_digest TEXT,
                retain_until_ms {bigint}
            )""",
            "CREATE INDEX tb_deferred_ops_poll ON tb_deferred_ops (next_poll_ms)",
            "CREATE INDEX tb_deferred_ops_expiry ON tb_deferred_ops (status, expires_ms)",
            "CREATE INDEX tb_deferred_ops_resume ON tb_deferred_ops (resumed_ms, status)",
            """CREATE TABLE tb_deferred_history (
                seq {serial},
                op_id TEXT NOT NULL,
                at_ms {bigint} NOT NULL,
                status TEXT NOT NULL,
                digest TEXT,
                code TEXT
            )""",
            "CREATE INDEX tb_deferred_history_op ON tb_deferred_history (op_id, seq)",
        ),
    ),
    (
        3,
        (
            # Paging runs newest first (the API, the UI): the (started_at, id) cursor walks an
            # index instead of sorting every run; a status filter (running among many ended
            # runs) and the metrics' counts by status walk the second.
            "CREATE INDEX tb_wf_runs_started ON tb_wf_runs (started_at, id)",
            "CREATE INDEX tb_wf_runs_status ON tb_wf_runs (status, started_at, id)",
            # The metrics read every timeout event at each scrape: a few among many events.
            "CREATE INDEX tb_events_kind ON tb_events (kind)",
        ),
    ),
    (
        4,
        (
            # The W3C trace context of a run's span, so a worker in another process continues
            # the run's trace (D10.5); NULL when spans were not exported at its start.
            "ALTER TABLE tb_wf_runs ADD COLUMN traceparent TEXT",
            # The trace context of the span that registered a deferred operation, so a poller in
            # another process polls it inside that trace (D10.6).
            "ALTER TABLE tb_deferred_ops ADD COLUMN traceparent TEXT",
        ),
    ),
    (
        5,
        (
            # The run's own bound (D6.17): which of the definition's timeout, the caller's
            # deadline or the parent's inherited deadline set timeout_at, as JSON
            # {set_by, duration_ms, deadline_at}; and how the run ended as a stable code
            # (error_code), so nothing recognises a timeout by its message.
            "ALTER TABLE tb_wf_runs ADD COLUMN timeout_bound TEXT",
            "ALTER TABLE tb_wf_runs ADD COLUMN error_code TEXT",
            # Idempotent starts (D6.18): one run per key; the digest of what was asked tells a
            # repeat from a different request under the same key.
            "ALTER TABLE tb_wf_runs ADD COLUMN idempotency_key TEXT",
            "ALTER TABLE tb_wf_runs ADD COLUMN request_digest TEXT",
            "CREATE UNIQUE INDEX tb_wf_runs_idem ON tb_wf_runs (idempotency_key)",
        ),
    ),
    (
        6,
        (
            # Tallies (D8.12, _store/_tally.py): running totals bumped by the transaction whose
            # change they count, so a scrape reads this small table instead of the history.
            """CREATE TABLE tb_tallies (
                name TEXT NOT NULL,
                a TEXT NOT NULL,
                b TEXT NOT NULL,
                n {bigint} NOT NULL,
                PRIMARY KEY (name, a, b)
            )""",
            # Retention (D8.13) deletes the runs that ended longest ago first, a batch at a time.
            "CREATE INDEX tb_wf_runs_finished ON tb_wf_runs (finished_at)",
            "INSERT INTO tb_tallies (name, a, b, n) SELECT 'wf_timeouts', layer, policy, COUNT(*) "
            f"FROM (SELECT {_LAYER} AS layer, COALESCE({{j_policy}}, 'None') AS policy "
            f"{_TIMEOUT_EVENTS}) t GROUP BY layer, policy",
            "INSERT INTO tb_tallies (name, a, b, n) "
            "SELECT 'wf_timeout_lag', layer, bucket, COUNT(*) "
            f"FROM (SELECT {_LAYER.replace('{j_type}', 'tt')} AS layer, {_BUCKET} AS bucket "
            f"FROM (SELECT {{j_type}} AS tt, {{j_lag}} AS lag {_TIMEOUT_EVENTS}) e "
            "WHERE lag IS NOT NULL) t GROUP BY layer, bucket",
            "INSERT INTO tb_tallies (name, a, b, n) "
            "SELECT 'wf_timeout_lag_ms_sum', layer, '', SUM(lag) "
            f"FROM (SELECT {_LAYER.replace('{j_type}', 'tt')} AS layer, lag "
            f"FROM (SELECT {{j_type}} AS tt, {{j_lag}} AS lag {_TIMEOUT_EVENTS}) e "
            "WHERE lag IS NOT NULL) t GROUP BY layer",
        ),
    ),
    (
        7,
        (
            # Worker processes on a shared store (D6.15, D6.16): what each can run, its
            # heartbeat, and the key of the session-level advisory lock its listening connection
            # holds while the process lives (survivors probe it to tell a dead worker).
            """CREATE TABLE tb_wf_workers (
                id TEXT PRIMARY KEY,
                actions TEXT NOT NULL,
                version TEXT NOT NULL,
                started_ms {bigint} NOT NULL,
                heartbeat_ms {bigint} NOT NULL,
                lock_key INTEGER
            )""",
            # The handler each node of each stored definition needs (NULL: any worker runs
            # it), so a claim selects only the tokens its worker can run (D6.15).
            """CREATE TABLE tb_wf_node_needs (
                definition_id TEXT NOT NULL,
                version INTEGER NOT NULL,
                node_id TEXT NOT NULL,
                handler TEXT,
                PRIMARY KEY (definition_id, version, node_id)
            )""",
        ),
    ),
    (
        8,
        (
            # One name per layer (D2.7): the node layer was stored as "execution" (a timed-out
            # token's event says timeout_type "execution", its state_data reason
            # "execution_timeout") and is "node" in memory, in DeadlineExceeded.source and in
            # the tallies; rename the stored rows. The JSON was written by json.dumps (": "
            # between key and value), and a string value holding the same text would have its
            # quotes escaped, so the replacement touches only these fields.
            "UPDATE tb_events SET data = REPLACE(data, "
            '\'"timeout_type": "execution"\', \'"timeout_type": "node"\') '
            "WHERE kind = 'token_timed_out' AND data LIKE '%\"timeout_type\": \"execution\"%'",
            "UPDATE tb_wf_tokens SET state_data = REPLACE(state_data, "
            '\'"reason": "execution_timeout"\', \'"reason": "node_timeout"\') '
            "WHERE status = 'timed_out' "
            'AND state_data LIKE \'%"reason": "execution_timeout"%\'',
            # Where a deferred operation's lifetime was set (D2.8): the connector's expires_at,
            # the action's max TTL, the caller's deadline or the host policy's max_ttl_s, so an
            # expiry reports it. NULL for operations registered before.
            "ALTER TABLE tb_deferred_ops ADD COLUMN expires_set_by TEXT",
        ),
    ),
    (
        9,
        (
            # D6.37: every reader of the event log reads one stream (by stream, seq); the
            # index by kind served the metrics' reads of every timeout event, which the
            # tallies replaced (D8.12). It cost each of the ~4 events of a step an insert.
            "DROP INDEX IF EXISTS tb_events_kind",
        ),
    ),
)


def render(statement: str, dialect: str) -> str:
    return statement.format(**_DIALECT[dialect])
