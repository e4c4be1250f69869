"""Workflow definitions are data: JSON, YAML or a dict, checked against the shipped JSON Schema.

Parsing happens in two passes. The JSON Schema (``schema.json``, printed by ``timebound workflow
schema``) checks shapes and rejects unknown fields; the semantic pass checks what a schema cannot:
ids that must exist, a ``sibling_group`` that must name a fan-out, ``m_of_n`` against the fan-out's
size. Either pass raises :class:`DefinitionError` naming the path of the offending field.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from .._core._errors import ConfigurationError
from .._json import JSONError, SchemaValidator, TooDeep, json_path
from .._json import check as check_json
from .._json import loads as loads_json
from ._modes import check_modes, default_support

__all__ = [
    "DefinitionConflict",
    "Action",
    "Definition",
    "DefinitionError",
    "DefinitionTooDeep",
    "DefinitionTooLarge",
    "Merge",
    "Node",
    "RetryBlock",
    "Synchronization",
    "Transition",
    "default_sync_timeout_ms",
    "parse_definition",
    "schema",
]

#: Defaults of D6.1/D6.2.
DEFAULT_WORKFLOW_TIMEOUT_MS = 3_600_000
DEFAULT_MAX_RETRIES = 3
SYNC_TIMEOUT_CAP_MS = 1_800_000

# Hostile-input limits (D6.23): text larger than this is refused before parsing; a definition
# with more nodes, actions or transitions than these is refused before the schema check (whose
# cost grows with them), and one nested deeper than MAX_DEPTH (D6.20) before anything walks it.
MAX_TEXT_BYTES = 4 * 1024 * 1024
# The host refuses a definition body past this many bytes while reading it, before parsing
# (D6.23): a definition at every count limit above weighs ~400 KB as compact JSON, and parsing
# holds the interpreter (the loop that fires the timers) ~30 ms per MB, even in a worker thread.
MAX_DEFINITION_BYTES = 512 * 1024
MAX_NODES = 1_000
MAX_ACTIONS = 1_000
MAX_TRANSITIONS = 2_000


class DefinitionError(ConfigurationError):
    """A workflow definition broke a rule. ``path`` names the field (``nodes[2].timeout_ms``)."""

    code = "workflow-definition-error"

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(f"{path}: {message}" if path else message, option=path or None)
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_definition_error, (str(self), self.path, type(self)))


class DefinitionTooLarge(DefinitionError):
    """A definition has more nodes, actions or transitions than the limits allow (D6.23)."""

    code = "definition-too-large"


class DefinitionTooDeep(DefinitionError):
    """A definition nests objects and arrays deeper than :data:`MAX_DEPTH` (D6.20)."""

    code = "too-deep"


class DefinitionConflict(DefinitionError):
    """One (id, version) would name two bodies: a new body needs a higher version. A run keeps
    the version it started with, so a stored version's body never changes."""

    code = "workflow-definition-conflict"


def _rebuild_definition_error(
    message: str, path: str, cls: type[DefinitionError] = DefinitionError
) -> DefinitionError:
    err = cls(message)
    err.path = path
    err.option = path or None
    return err


@dataclass(frozen=True)
class RetryBlock:
    """Retries of action errors (not timeouts): the node's ``retry`` block."""

    max_attempts: int
    delay_ms: int = 0
    backoff: Literal["fixed", "linear", "exponential"] = "fixed"
    max_delay_ms: int = 30_000


@dataclass(frozen=True)
class Action:
    id: str
    kind: Literal["python", "http_request", "workflow_call", "deferred"]
    implementation: dict[str, Any]
    timeout_ms: int | None = None
    on_timeout: Literal["fail", "retry"] | None = None
    #: ``sync-only`` | ``either`` | ``async-only`` (see ``_modes``).
    execution_mode_support: str = "sync-only"
    #: ``{preferred_retry_after_seconds, preferred_max_ttl_seconds}``: hints the host policy clamps.
    deferred_profile: dict[str, int] | None = None
    #: The reserve of the nodes that run it and set none of their own (D6.32).
    reserve_ms: int = 0


@dataclass(frozen=True)
class Node:
    id: str
    action_id: str
    timeout_ms: int | None = None
    timeout_set: bool = False  # ``timeout_ms: null`` on the node overrides the action's
    on_timeout: Literal["fail", "retry"] | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    inherit_deadline: bool = False
    retry: RetryBlock | None = None
    timing_mode: Literal["sync", "async"] | None = None  # ``timing.mode``; None: the action's
    #: Kept for the answer (D6.32): the handler runs seeing its deadline less this; 0: none.
    reserve_ms: int = 0


@dataclass(frozen=True)
class Merge:
    source: str
    target: str
    strategy: Literal["append", "merge_object", "keyed_by_branch", "last_wins"]


@dataclass(frozen=True)
class Synchronization:
    strategy: str  # "all" | "any" | "m_of_n"
    required: int | None  # m for m_of_n
    sibling_group: str
    timeout_ms: int | None
    on_timeout: Literal["proceed_with_available", "fail"]
    merge: Merge | None


@dataclass(frozen=True)
class Transition:
    id: str
    source: str
    target: str
    spawn_count: int | None = None
    foreach: str | None = None
    synchronization: Synchronization | None = None

    @property
    def fans_out(self) -> bool:
        return self.spawn_count is not None or self.foreach is not None


@dataclass(frozen=True)
class Definition:
    """A validated definition; ``raw`` is the canonical dict that is stored and compared."""

    id: str
    version: int
    timeout_ms: int | None
    on_timeout: Literal["cancel_all", "fail"]
    initial_node: str
    actions: dict[str, Action]
    nodes: dict[str, Node]
    transitions: dict[str, Transition]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def deferred_response_mode(self) -> str:
        """``surface-to-caller`` (default): a deferred answer suspends the node; or
        ``reject-as-failure``: the run fails with ``deferred-not-accepted``."""
        return str(self.raw.get("deferred_response_mode", "surface-to-caller"))

    @functools.cached_property
    def cyclic(self) -> frozenset[str]:
        """The nodes a run can reach again from themselves (a loop): a token made for one of
        them is counted against the run's limits (D6.24). Strongly connected components of
        more than one node, or with an edge to itself (Kosaraju's, without recursion)."""
        succ: dict[str, list[str]] = {n: [] for n in self.nodes}
        pred: dict[str, list[str]] = {n: [] for n in self.nodes}
        looped = set()
        for t in self.transitions.values():
            succ[t.source].append(t.target)
            pred[t.target].append(t.source)
            if t.source == t.target:
                looped.add(t.source)
        order: list[str] = []
        seen: set[str] = set()
        for start in self.nodes:
            if start in seen:
                continue
            seen.add(start)
            stack = [(start, iter(succ[start]))]
            while stack:
                node, it = stack[-1]
                nxt = next((m for m in it if m not in seen), None)
                if nxt is None:
                    order.append(node)
                    stack.pop()
                else:
                    seen.add(nxt)
                    stack.append((nxt, iter(succ[nxt])))
        placed: set[str] = set()
        for start in reversed(order):
            if start in placed:
                continue
            component, todo = [], [start]
            placed.add(start)
            while todo:
                node = todo.pop()
                component.append(node)
                for m in pred[node]:
                    if m not in placed:
                        placed.add(m)
                        todo.append(m)
            if len(component) > 1:
                looped.update(component)
        return frozenset(looped)

    @functools.cached_property
    def _outgoing(self) -> dict[str, tuple[Transition, ...]]:
        by_source: dict[str, list[Transition]] = {}
        for t in self.transitions.values():
            by_source.setdefault(t.source, []).append(t)
        return {source: tuple(ts) for source, ts in by_source.items()}

    def outgoing(self, node_id: str) -> list[Transition]:
        """The transitions leaving ``node_id``, in definition order (an index built once: a
        walk over a large definition asks for every node)."""
        return list(self._outgoing.get(node_id, ()))

    def join_for_group(self, fan_out_id: str) -> Transition | None:
        for t in self.transitions.values():
            if t.synchronization is not None and t.synchronization.sibling_group == fan_out_id:
                return t
        return None

    def node_timeout_ms(self, node: Node) -> int | None:
        """Node > action (D6): the node's ``timeout_ms``, else its action's; no default."""
        if node.timeout_set:
            return node.timeout_ms
        return self.actions[node.action_id].timeout_ms

    def node_on_timeout(self, node: Node) -> Literal["fail", "retry"]:
        return node.on_timeout or self.actions[node.action_id].on_timeout or "fail"

    def sync_timeout_ms(self, join: Transition, spawned: int) -> int:
        """The join's timeout, else D6.2's default from the fan-out's actual size ``spawned``."""
        sync = join.synchronization
        assert sync is not None
        if sync.timeout_ms is not None:
            return sync.timeout_ms
        basis = self.sync_timeout_basis(join)
        return default_sync_timeout_ms(None if basis is None else basis[0], spawned)

    def sync_timeout_basis(self, join: Transition) -> tuple[int, str] | None:
        """D6.2's ``maxActionTimeout``: the largest node timeout of the join's branch (the nodes
        reachable from the fan-out's target without crossing this join) and the node that has
        it; ``None`` when no node of the branch has one."""
        sync = join.synchronization
        assert sync is not None
        branch, todo = set(), [self.transitions[sync.sibling_group].target]
        while todo:
            node_id = todo.pop()
            if node_id not in branch:
                branch.add(node_id)
                todo += [t.target for t in self.outgoing(node_id) if t.id != join.id]
        timeouts = [
            (t, n) for n in sorted(branch) if (t := self.node_timeout_ms(self.nodes[n])) is not None
        ]
        return max(timeouts, key=lambda tn: tn[0]) if timeouts else None


def _check_reserve(node: Node, action: Action, where: str) -> None:
    """A node's reserve (D6.32), its own or its action's ``execution.reserve_ms``, keeps time
    for a python handler's answer within the node's bound: one no shorter than the node's timeout
    would leave the handler nothing. ``where`` names the field that set the reserve."""
    if not node.reserve_ms:
        return
    if action.kind != "python":
        raise DefinitionError(
            f"a reserve is kept for a python handler's answer; action {action.id!r} is "
            f"{action.kind}",
            path=where,
        )
    timeout = node.timeout_ms if node.timeout_set else action.timeout_ms
    if timeout is not None and node.reserve_ms >= timeout:
        raise DefinitionError(
            f"the reserve of {node.reserve_ms} ms leaves nothing of the node's timeout of "
            f"{timeout} ms: a reserve must be shorter than the timeout",
            path=where,
        )


def default_sync_timeout_ms(max_action_timeout_ms: int | None, spawned: int) -> int:
    """D6.2: ``min(maxActionTimeout * spawnCount * 1.5, 30 min)``, or the cap with no action
    timeout to compute it from (the same formula in docs/workflows.md)."""
    if max_action_timeout_ms is None:
        return SYNC_TIMEOUT_CAP_MS
    return min(math.floor(max_action_timeout_ms * spawned * 1.5), SYNC_TIMEOUT_CAP_MS)


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of workflow definitions, as shipped in the package."""
    text = resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _validator() -> SchemaValidator:
    return SchemaValidator(schema())


def _load_text(text: str, origin: str) -> Any:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise DefinitionError(f"{origin} is larger than {MAX_TEXT_BYTES} bytes")
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            return loads_json(text, what=origin)
        try:
            import yaml
        except ImportError:
            # D8.17: say which extra, not "not valid YAML".
            raise DefinitionError(
                f"{origin}: reading YAML needs PyYAML, which the 'workflow' extra installs: "
                "pip install 'timebound[workflow]' (or write the definition as JSON)"
            ) from None

        # Aliases let a few lines of YAML stand for an exponentially large document (the
        # "billion laughs"): a definition never needs them, so they are refused.
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise DefinitionError(f"{origin}: YAML aliases are not allowed in definitions")
        return yaml.safe_load(text)
    except DefinitionError:
        raise
    except TooDeep as exc:
        raise DefinitionTooDeep(str(exc), path=exc.path.removeprefix("$").lstrip("."))
    except RecursionError:
        raise DefinitionTooDeep(f"{origin} is nested too deeply")
    except JSONError as exc:
        raise DefinitionError(f"{origin} is not valid JSON: {exc.reason or exc}")
    except ValueError as exc:  # json.JSONDecodeError
        raise DefinitionError(f"{origin} is not valid JSON: {exc}")
    except Exception as exc:  # yaml.YAMLError and its subclasses
        raise DefinitionError(f"{origin} is not valid YAML: {exc}")


def load_source(source: dict[str, Any] | str | Path) -> Any:
    """A definition as plain data, from a dict, JSON/YAML text or a file path."""
    if isinstance(source, dict):
        return source
    if isinstance(source, Path) or (
        isinstance(source, str)
        and "\n" not in source
        and source.endswith((".json", ".yaml", ".yml"))
    ):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DefinitionError(f"cannot read definition file {str(path)!r}: {exc}")
        return _load_text(text, str(path))
    if isinstance(source, str):
        return _load_text(source, "definition text")
    raise DefinitionError(
        f"a definition is a dict, JSON/YAML text or a path, not {type(source).__name__}"
    )


def parse_definition(source: dict[str, Any] | str | Path) -> Definition:
    """Validate a definition and build its typed form; raise :class:`DefinitionError`."""
    data = load_source(source)
    check_size(data)
    try:
        problem = _validator().first_problem(data)
    except RecursionError:  # pragma: no cover - check_size refused anything this deep
        raise DefinitionTooDeep("the definition is nested too deeply")
    if problem is not None:
        message = problem.message
        if problem.rule == "additionalProperties":
            message = f"unknown field ({problem.message})"
        path = json_path(problem.parts, root="") if problem.parts else "<definition>"
        raise DefinitionError(message, path=path)
    return _build(data)


def check_size(data: Any) -> None:
    """Refuse a definition past the limits of D6.23 (counts) and D6.20 (nesting), before any
    check whose cost grows with it: :class:`DefinitionTooLarge`, :class:`DefinitionTooDeep`."""
    try:
        check_json(data, what="the definition", root="")
    except TooDeep as exc:
        raise DefinitionTooDeep(str(exc), path=exc.path) from None
    except JSONError as exc:
        raise DefinitionError(str(exc), path=exc.path) from None
    if not isinstance(data, dict):
        return  # the schema says what it should be
    for key, limit in (
        ("nodes", MAX_NODES),
        ("actions", MAX_ACTIONS),
        ("transitions", MAX_TRANSITIONS),
    ):
        items = data.get(key)
        if isinstance(items, list) and len(items) > limit:
            raise DefinitionTooLarge(
                f"{len(items)} {key}: a definition has at most {limit}", path=key
            )


def _build(data: dict[str, Any]) -> Definition:
    actions: dict[str, Action] = {}
    for i, a in enumerate(data.get("actions", [])):
        if a["id"] in actions:
            raise DefinitionError(f"duplicate action id {a['id']!r}", path=f"actions[{i}].id")
        execution = a.get("execution", {})
        actions[a["id"]] = Action(
            a["id"],
            a["kind"],
            dict(a["implementation"]),
            execution.get("timeout_ms"),
            execution.get("on_timeout"),
            a.get("execution_mode_support", default_support(a["kind"])),
            a.get("deferred_profile"),
            execution.get("reserve_ms", 0),
        )
    nodes: dict[str, Node] = {}
    position = {a: j for j, a in enumerate(actions)}  # where an action is, for its errors
    for i, n in enumerate(data["nodes"]):
        if n["id"] in nodes:
            raise DefinitionError(f"duplicate node id {n['id']!r}", path=f"nodes[{i}].id")
        if n["action_id"] not in actions:
            raise DefinitionError(
                f"unknown action id {n['action_id']!r}", path=f"nodes[{i}].action_id"
            )
        r = n.get("retry")
        node = Node(
            id=n["id"],
            action_id=n["action_id"],
            timeout_ms=n.get("timeout_ms"),
            timeout_set="timeout_ms" in n,
            on_timeout=n.get("on_timeout"),
            max_retries=n.get("max_retries", DEFAULT_MAX_RETRIES),
            inherit_deadline=n.get("inherit_deadline", False),
            timing_mode=n.get("timing", {}).get("mode"),
            reserve_ms=n.get("reserve_ms", actions[n["action_id"]].reserve_ms),
            retry=None
            if r is None
            else RetryBlock(
                r["max_attempts"],
                r.get("delay_ms", 0),
                r.get("backoff", "fixed"),
                r.get("max_delay_ms", 30_000),
            ),
        )
        if "reserve_ms" in n:
            _check_reserve(node, actions[node.action_id], f"nodes[{i}].reserve_ms")
        elif node.reserve_ms:
            at = f"actions[{position[node.action_id]}].execution.reserve_ms"
            _check_reserve(node, actions[node.action_id], at)
        nodes[node.id] = node
    check_modes(data, DefinitionError)
    if data["initial_node"] not in nodes:
        raise DefinitionError(f"unknown node id {data['initial_node']!r}", path="initial_node")
    transitions: dict[str, Transition] = {}
    raw_transitions = data.get("transitions", [])
    for i, t in enumerate(raw_transitions):
        where = f"transitions[{i}]"
        if t["id"] in transitions:
            raise DefinitionError(f"duplicate transition id {t['id']!r}", path=f"{where}.id")
        for end in ("from", "to"):
            if t[end] not in nodes:
                raise DefinitionError(f"unknown node id {t[end]!r}", path=f"{where}.{end}")
        transitions[t["id"]] = Transition(
            t["id"], t["from"], t["to"], t.get("spawn_count"), t.get("foreach"), None
        )
    for i, t in enumerate(raw_transitions):
        s = t.get("synchronization")
        if s is None:
            continue
        where = f"transitions[{i}].synchronization"
        fan = transitions.get(s["sibling_group"])
        if fan is None or not fan.fans_out:
            raise DefinitionError(
                f"sibling_group {s['sibling_group']!r} is not a fan-out transition "
                "(one with spawn_count or foreach)",
                path=f"{where}.sibling_group",
            )
        strategy = s["strategy"]
        required = None
        if isinstance(strategy, dict):
            required = strategy["m_of_n"]
            if fan.spawn_count is not None and required > fan.spawn_count:
                raise DefinitionError(
                    f"m_of_n {required} is larger than the fan-out's spawn_count {fan.spawn_count}",
                    path=f"{where}.strategy.m_of_n",
                )
            strategy = "m_of_n"
        m = s.get("merge")
        if m is not None:
            if not m["source"].startswith("_branch."):
                raise DefinitionError(
                    "a merge source is a path in the branch context, starting with '_branch.'",
                    path=f"{where}.merge.source",
                )
            if not m["target"].startswith("state.") or m["target"] == "state":
                raise DefinitionError(
                    "a merge target is a path under 'state.'", path=f"{where}.merge.target"
                )
        transitions[t["id"]] = Transition(
            t["id"],
            t["from"],
            t["to"],
            None,
            None,
            Synchronization(
                strategy,
                required,
                s["sibling_group"],
                s.get("timeout_ms"),
                s.get("on_timeout", "fail"),
                None if m is None else Merge(m["source"], m["target"], m["strategy"]),
            ),
        )
    _check_foreach_paths(raw_transitions)
    _check_join_groups(raw_transitions, transitions)
    seen_groups: dict[str, int] = {}
    for i, t in enumerate(raw_transitions):
        s = t.get("synchronization")
        if s is not None:
            group = s["sibling_group"]
            if group in seen_groups:
                raise DefinitionError(
                    f"sibling_group {group!r} is already joined by transitions"
                    f"[{seen_groups[group]}]",
                    path=f"transitions[{i}].synchronization.sibling_group",
                )
            seen_groups[group] = i
    definition = Definition(
        id=data["id"],
        version=data.get("version", 1),
        timeout_ms=data.get("timeout_ms", DEFAULT_WORKFLOW_TIMEOUT_MS),
        on_timeout=data.get("on_timeout", "cancel_all"),
        initial_node=data["initial_node"],
        actions=actions,
        nodes=nodes,
        transitions=transitions,
        raw=json.loads(json.dumps(data, sort_keys=True)),
    )
    for i, n in enumerate(data["nodes"]):
        node = nodes[n["id"]]
        if definition.node_on_timeout(node) == "retry" and definition.node_timeout_ms(node) is None:
            raise DefinitionError(
                "on_timeout 'retry' needs a timeout to retry after: set timeout_ms on the node "
                "or execution.timeout_ms on its action",
                path=f"nodes[{i}].on_timeout" if "on_timeout" in n else f"nodes[{i}]",
            )
    return definition


def _check_foreach_paths(raw_transitions: list[dict[str, Any]]) -> None:
    """A ``foreach`` path reads the run's context, whose roots are ``input`` and ``state``
    (D6.19): any other root can never resolve, so it is refused here, not at run time."""
    for i, t in enumerate(raw_transitions):
        path = t.get("foreach")
        if path is None:
            continue
        root = path.split(".", 1)[0]
        if root != "input" and not path.startswith("state."):
            raise DefinitionError(
                f"foreach path {path!r} cannot resolve: it is read from the run's context, "
                f"so it starts with 'input' or 'state.' (e.g. 'input.{path}')",
                path=f"transitions[{i}].foreach",
            )


def _check_join_groups(
    raw_transitions: list[dict[str, Any]], transitions: dict[str, Transition]
) -> None:
    """A join waits for the siblings of its ``sibling_group`` (D6.19): its ``from`` node must be
    one that fan-out's branches reach (through plain transitions, or past a nested fan-out's
    own join). Otherwise every token that arrives belongs to another group and fails the run,
    so the definition is refused here, not at run time."""
    outgoing: dict[str, list[Transition]] = {}
    for t in transitions.values():
        outgoing.setdefault(t.source, []).append(t)
    joins = {
        t.synchronization.sibling_group: t
        for t in transitions.values()
        if t.synchronization is not None
    }
    for i, raw in enumerate(raw_transitions):
        sync = raw.get("synchronization")
        if sync is None:
            continue
        fan = transitions[sync["sibling_group"]]
        reached, todo = {fan.target}, [fan.target]
        while todo:
            for t in outgoing.get(todo.pop(), []):
                if t.synchronization is not None:
                    continue  # a join leaves the branch
                nxt = t.target
                if t.fans_out:
                    nested = joins.get(t.id)  # its branches come back to this group there
                    if nested is None:
                        continue
                    nxt = nested.target
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        if raw["from"] not in reached:
            raise DefinitionError(
                f"join {raw['id']!r} waits for the siblings of fan-out {fan.id!r}, but its "
                f"node {raw['from']!r} is not reached by that fan-out's branches",
                path=f"transitions[{i}].synchronization.sibling_group",
            )
