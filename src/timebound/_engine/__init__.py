"""Execution machinery shared by the engines (not a public API): the DAG executor."""

from ._dag import DagPlan, Event, Group, Node, Span

__all__ = ["DagPlan", "Event", "Group", "Node", "Span"]
