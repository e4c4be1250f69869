"""The rows a state-machine transaction works on: a run read (and locked) once per
transaction and kept current as it changes, tokens, and the definition a run started with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .._store import Tx
from ._definition import Definition, parse_definition

__all__ = ["HeldRows"]


class HeldRows:
    """How the state machine reads runs, tokens and definitions (a part of
    :class:`~timebound.workflow._machine.Machine`, which provides ``definitions``)."""

    definitions: dict[tuple[str, int], Definition]

    async def run(self, tx: Tx, run_id: str, *, lock: str = "") -> dict[str, Any] | None:
        """The run's row, read once per transaction when the transaction holds it.

        A row read under its lock (``lock``, PostgreSQL's ``FOR UPDATE``) or in an exclusive
        transaction (SQLite) cannot change behind us until the commit, so it is kept in
        ``tx.held`` and answered from there: a turn reads and locks a run once, however many of
        its tokens it handles. Every change of a run goes through :meth:`_run_changed`, which
        keeps the held row current. An unlocked read on a shared store is never kept (another
        worker may change the row), but a held row answers it: we hold its lock.
        """
        held = tx.held.get(("run", run_id))
        if held is not None:
            return held  # type: ignore[no-any-return]
        row = await tx.fetch_row(
            ("run", run_id), f"SELECT * FROM tb_wf_runs WHERE id = ?{lock}", run_id
        )
        if row is not None and (lock or tx.exclusive):
            tx.held[("run", run_id)] = row
        return row

    async def hold_runs(self, tx: Tx, run_ids: Iterable[str], *, lock: str = "") -> None:
        """Read (and lock, in id order) the runs not yet held, one statement per 500: what
        :meth:`run` would read one by one for each token of a turn."""
        if not (lock or tx.exclusive):
            return
        wanted = sorted({r for r in run_ids if ("run", r) not in tx.held})
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            for row in await tx.fetch_rows(
                [("run", r) for r in chunk],
                f"SELECT * FROM tb_wf_runs WHERE id IN ({marks}) ORDER BY id{lock}",
                *chunk,
            ):
                tx.held[("run", row["id"])] = row

    @staticmethod
    def _run_changed(tx: Tx, run: dict[str, Any], **fields: Any) -> None:
        """Record in ``run`` (and in the held row, if it is another dict) what was just written."""
        run.update(fields)
        held = tx.held.get(("run", run["id"]))
        if held is not None and held is not run:
            held.update(fields)

    async def token(self, tx: Tx, token_id: str) -> dict[str, Any] | None:
        """The token's row: the one :meth:`hold_tokens` read, if nothing may have changed it
        since; else read now."""
        ahead = tx.held.pop(("tok-ahead", token_id), None)
        if ahead is not None:
            mark, row = ahead
            if tx.rows_unchanged(mark, ("tok", token_id), "tb_wf_tokens"):
                return row  # type: ignore[no-any-return]
        return await tx.fetch_row(
            ("tok", token_id), "SELECT * FROM tb_wf_tokens WHERE id = ?", token_id
        )

    async def hold_tokens(self, tx: Tx, token_ids: Iterable[str]) -> None:
        """Read the tokens a turn is about to handle one by one, one statement per 500; each is
        answered by :meth:`token` once, while no write since may have changed it. The caller
        holds their runs' locks (a token changes only under its run's lock)."""
        wanted = sorted(set(token_ids))
        mark = tx.write_mark()
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            for row in await tx.fetch_rows(
                [("tok", t) for t in chunk],
                f"SELECT * FROM tb_wf_tokens WHERE id IN ({marks})",
                *chunk,
            ):
                tx.held[("tok-ahead", row["id"])] = (mark, row)

    async def definition(self, tx: Tx, run: dict[str, Any]) -> Definition:
        """The definition a run started with (runs keep their version), cached by the engine."""
        key = (run["definition_id"], int(run["definition_version"]))
        found = self.definitions.get(key)
        if found is None:
            row = await tx.fetchone(
                "SELECT body FROM tb_wf_definitions WHERE id = ? AND version = ?", *key
            )
            if row is None:
                raise LookupError(f"definition {key[0]!r} version {key[1]} is not stored")
            found = self.definitions[key] = parse_definition(json.loads(row["body"]))
        return found
