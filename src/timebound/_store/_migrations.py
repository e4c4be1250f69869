"""One migration history for every durable engine, on SQLite and PostgreSQL alike.

Each migration is a list of statements written once; ``{serial}`` and ``{bigint}`` are the only
dialect differences. Times are absolute epoch milliseconds written by the engine (D1.10, D6.12),
never a database clock, so both stores compare the same numbers.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "render"]

_DIALECT = {
    "sqlite": {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "bigint": "INTEGER"},
    "postgres": {"serial": "BIGSERIAL PRIMARY KEY", "bigint": "BIGINT"},
}

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
)


def render(statement: str, dialect: str) -> str:
    return statement.format(**_DIALECT[dialect])
