"""Execution machinery shared by the engines (not a public API): a generic DAG executor."""

from ._dag import DagPlan, Node, Span

__all__ = ["DagPlan", "Node", "Span"]
