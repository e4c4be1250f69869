"""The pipeline's errors: validation (fail-closed, with a rule name), task errors, plan timeouts."""

from __future__ import annotations

from typing import Any

from .._core._errors import DeadlineExceeded, InvalidInput, TimeboundError

__all__ = ["PlanTimeout", "TaskError", "ValidationError"]

# The validation rules of a plan (stable codes, listed in docs/pipeline.md), plus the engine's
# own reference checks.
RULES = frozenset(
    {
        "closure",
        "preserve",
        "writes_exact",
        "shape_equality",
        "override_origin",
        "override_clamp",
        "capability",
        "schema",  # the artifact does not match the Plan/Fragment JSON schema
        "reference",  # an unknown key, param, task or fragment
        "type",  # an expression, param value or input column of the wrong type
        "fill_defaults",  # a non-nullable key without a default
        "reserve",  # a region reserve no shorter than the longest budget it can get (D5.9)
    }
)


class ValidationError(InvalidInput):
    """A plan, artifact or run input broke a validation rule (fail-closed; an
    :class:`~timebound.InvalidInput`, D2.6).

    ``rule`` names the rule, ``node_id`` the node (``None`` for the whole plan), ``source_span``
    the authoring call (``{"file": ..., "line": ...}``) when known, ``details`` what differs.
    """

    code = "pipeline-validation"

    @property
    def field(self) -> str | None:
        return self.node_id

    def __init__(
        self,
        rule: str,
        message: str,
        *,
        node_id: str | None = None,
        source_span: dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown validation rule {rule!r}")
        where = ""
        if source_span is not None:
            where = f" ({source_span.get('file')}:{source_span.get('line')})"
        node = f"node {node_id}: " if node_id is not None else ""
        super().__init__(f"[{rule}] {node}{message}{where}")
        self.rule = rule
        self.node_id = node_id
        self.source_span = source_span
        self.message = message
        self.details = details or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_validation,
            (self.rule, self.message, self.node_id, self.source_span, self.details),
        )


def _rebuild_validation(
    rule: str,
    message: str,
    node_id: str | None,
    source_span: dict[str, Any] | None,
    details: dict[str, Any],
) -> ValidationError:
    return ValidationError(rule, message, node_id=node_id, source_span=source_span, details=details)


class TaskError(TimeboundError):
    """A task broke its contract (a missing, extra, short or mistyped column). ``task`` and
    ``key`` name what; ``node_id`` and ``source_span`` (the authoring call) name where."""

    code = "pipeline-task"

    def __init__(self, message: str, *, task: str, key: str | None = None) -> None:
        super().__init__(message)
        self.task = task
        self.key = key
        self.node_id: str | None = None
        self.source_span: dict[str, Any] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_task_error, (str(self), self.task, self.key))


def _rebuild_task_error(message: str, task: str, key: str | None) -> TaskError:
    return TaskError(message, task=task, key=key)


class PlanTimeout(DeadlineExceeded):
    """A ``timeout_wrapper`` with ``on_timeout="fail_plan"`` ran out of its region budget.

    ``node_id``/``op`` name the wrapper, ``timeout_ms`` is the budget it computed, ``trace`` the
    run's :class:`~timebound.pipeline.Trace` up to the failure (its wrapper entry says
    ``chosen_branch: "fail_plan"``). ``reserve_ms`` is the wrapper's reserve when the bound that
    fired is that reserve's (D5.9; ``set_by`` then says ``reserve of region <id>``).
    """

    code = "pipeline-plan-timeout"

    def __init__(
        self,
        message: str | None = None,
        *,
        node_id: str,
        op: str = "timeout_wrapper",
        timeout_ms: float,
        trace: Any = None,
        deadline: Any = None,
        reserve_ms: float | None = None,
    ) -> None:
        super().__init__(
            message or f"timeout_wrapper {node_id} timed out after {timeout_ms:g} ms",
            source="region",
            timeout=timeout_ms / 1000.0,
            deadline=deadline,
            set_by=f"region {node_id}" if reserve_ms is None else f"reserve of region {node_id}",
        )
        self.node_id = node_id
        self.op = op
        self.timeout_ms = timeout_ms
        self.trace = trace
        self.reserve_ms = reserve_ms
