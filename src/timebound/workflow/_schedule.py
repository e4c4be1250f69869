"""What the worker loop knows, between its turns, of when it next has work (D6.29).

A turn used to ask the store four scheduling questions every time: which timers are due, which
tokens are ready, when the next timer is due and when the next pending token becomes ready. For
a run the engine already holds the answers are known: every timer and every pending token a
turn makes goes through its own transaction (:meth:`Tx.set_timer`, :func:`made_pending`), so the
loop carries the answers from one turn to the next and asks again only when something else may
have changed the store: a transaction other than the turn committed on this store (an
operator's action, a cancel, a deferred completion, housekeeping), another process notified a
commit (a shared store), or the turn failed. A sweep on a shared store is such a transaction,
so another worker's timers and tokens are learned at the latest one sweep later.

Never early, never lost: a known instant may be earlier than the store's (a timer cleared since),
which costs one turn that asks again; it is never later, since whatever makes a timer or a
pending token in a turn records it here.
"""

from __future__ import annotations

from typing import Any

from .._store import Tx

__all__ = ["Schedule", "made_pending", "new_tokens", "pending_floor"]

_NEW = "schedule.new_tokens"  # tx.held: the rows of the tokens this transaction inserted
_FLOOR = "schedule.pending"  # tx.held: the earliest not_before of other tokens made pending


def made_pending(tx: Tx, not_before: int, row: dict[str, Any] | None = None) -> None:
    """Record that this transaction made a token pending from ``not_before``: a new token's
    ``row`` (as inserted), or any other token (a retry, a re-queue) without one."""
    if row is not None:
        tx.held.setdefault(_NEW, []).append(row)
        return
    floor = tx.held.get(_FLOOR)
    tx.held[_FLOOR] = not_before if floor is None else min(floor, not_before)


def new_tokens(tx: Tx) -> list[dict[str, Any]]:
    """The tokens this transaction inserted, in creation order (their rows as inserted)."""
    return tx.held.get(_NEW, [])  # type: ignore[no-any-return]


def pending_floor(tx: Tx) -> int | None:
    """The earliest ``not_before`` of the tokens made pending in this transaction otherwise
    than by their insertion; ``None`` if there are none."""
    floor: int | None = tx.held.get(_FLOOR)
    return floor


class Schedule:
    """The loop's knowledge: the earliest stored timer (``timer_ms``) and the earliest
    ``not_before`` of a pending token (``pending_ms``); ``None`` is none at all. Valid only
    while ``known``."""

    def __init__(self) -> None:
        self.known = False
        self.timer_ms: int | None = None
        self.pending_ms: int | None = None
        self._generation = 0
        self._commits = 0

    def forget(self) -> None:
        """Something may have changed the store behind the loop: ask it again next turn."""
        self.known = False
        self._generation += 1

    def begin(self, commits: int) -> int:
        """A turn begins (the store has committed ``commits`` transactions): a token of it for
        :meth:`learn`. A transaction committed since the last turn's makes the loop forget."""
        if commits != self._commits:
            self.forget()
        self._commits = commits
        return self._generation

    def timers_due(self, now: int) -> bool:
        """Whether a turn at ``now`` must look for due timers."""
        return not self.known or (self.timer_ms is not None and self.timer_ms <= now)

    def learn(self, token: int, commits: int, timer_ms: int | None, pending_ms: int | None) -> None:
        """The turn that began with ``token`` committed, the store's commits now ``commits``,
        leaving the answers given; kept only if nothing else committed or was notified since
        the turn began."""
        if token != self._generation or commits != self._commits + 1:
            self.forget()
        else:
            self.known = True
            self.timer_ms, self.pending_ms = timer_ms, pending_ms
        self._commits = commits
