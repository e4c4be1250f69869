"""The workflow state machine: every durable change of runs, tokens and joins, one transaction each.

All functions take an open transaction and the current instant ``now`` (epoch ms, floored so a
deadline is never reached early). Each change writes its event in the same transaction, so a
crash leaves either both or neither. The three timeout layers live here:

* workflow: :meth:`Machine.workflow_timeout`, checked first by every entry point (D6.4);
* node: :meth:`Machine.token_timeout` (``fail`` or ``retry``; pending/dispatched → ``fail``);
* synchronization: :meth:`Machine.join_timeout`, from the first arrival (D6.2, D6.3).

The machine is composed of one part per idea: :mod:`._held` (the rows a transaction works on),
:mod:`._tokens` (a token's moves), :mod:`._runs` (a run's moves) and :mod:`._outcomes` (what an
attempt's outcome does); joins and child runs are :mod:`._joins` and :mod:`._children`.
"""

from __future__ import annotations

from collections.abc import Callable

from ._children import Children
from ._definition import Definition
from ._joins import Joins
from ._outcomes import Outcomes, retry_delay_ms
from ._rows import RunEnd
from ._runs import BULK_CANCEL_AFTER

__all__ = ["BULK_CANCEL_AFTER", "Machine", "retry_delay_ms"]


class Machine(Outcomes):
    """State transitions for one engine. ``cancel_attempt(token_id)`` stops local in-flight work."""

    def __init__(
        self,
        definitions: dict[tuple[str, int], Definition],
        cancel_attempt: Callable[[str], None],
        on_run_finished: Callable[[str, RunEnd | None], None],
    ) -> None:
        self.definitions = definitions
        self._cancel_attempt = cancel_attempt
        self._on_run_finished = on_run_finished
        self.late_results = 0
        self._seq = 0
        self.joins = Joins(self)
        self.children = Children(self)
