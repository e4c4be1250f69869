"""Definitions as data: the shipped schema, unknown fields, semantic rules, hostile input."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from timebound import ConfigurationError
from timebound import workflow as wf

BASE: dict[str, Any] = {
    "id": "research",
    "initial_node": "A",
    "actions": [{"id": "act", "kind": "python", "implementation": {"handler": "fetch"}}],
    "nodes": [{"id": "A", "action_id": "act"}, {"id": "B", "action_id": "act"}],
    "transitions": [
        {"id": "fan", "from": "A", "to": "B", "spawn_count": 3},
    ],
}


def _with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def _error(data: Any) -> wf.DefinitionError:
    with pytest.raises(wf.DefinitionError) as info:
        wf.parse_definition(data)
    return info.value


def test_defaults_follow_d6_1() -> None:
    """An absent workflow timeout is one hour with cancel_all, and version defaults to 1."""
    d = wf.parse_definition(BASE)
    assert (d.timeout_ms, d.on_timeout, d.version) == (3_600_000, "cancel_all", 1)


def test_null_timeout_means_no_workflow_timeout() -> None:
    """timeout_ms: null disables the workflow timeout."""
    assert wf.parse_definition(_with(timeout_ms=None)).timeout_ms is None


def test_unknown_top_level_field_is_rejected_with_its_path() -> None:
    """An unknown field is named in the error."""
    err = _error(_with(timout_ms=5))
    assert "unknown field" in str(err) and "timout_ms" in str(err)


def test_unknown_nested_field_names_the_path() -> None:
    """An unknown field inside a node reports the node's path."""
    data = _with()
    data["nodes"][1]["retries"] = 2
    err = _error(data)
    assert err.path == "nodes[1]" and "retries" in str(err)


def test_definition_error_is_a_configuration_error() -> None:
    """DefinitionError is a ConfigurationError, as the API promises."""
    assert isinstance(_error(_with(timeout_ms=0)), ConfigurationError)


def test_non_positive_timeout_is_rejected() -> None:
    """A zero node timeout names the field."""
    data = _with()
    data["nodes"][0]["timeout_ms"] = 0
    assert _error(data).path == "nodes[0].timeout_ms"


def test_missing_initial_node_is_named() -> None:
    """A definition without initial_node says so."""
    data = _with()
    del data["initial_node"]
    assert "initial_node" in str(_error(data))


def test_unknown_initial_node_is_named() -> None:
    """initial_node must name a node."""
    assert _error(_with(initial_node="Z")).path == "initial_node"


def test_unknown_action_id_is_named() -> None:
    """A node's action_id must name an action."""
    data = _with()
    data["nodes"][1]["action_id"] = "nope"
    assert _error(data).path == "nodes[1].action_id"


def test_unknown_transition_end_is_named() -> None:
    """A transition's 'to' must name a node."""
    data = _with()
    data["transitions"][0]["to"] = "Q"
    assert _error(data).path == "transitions[0].to"


def test_sibling_group_must_be_a_fan_out() -> None:
    """A join's sibling_group that names a plain transition is rejected."""
    data = _with()
    data["nodes"].append({"id": "C", "action_id": "act"})
    data["transitions"] = [
        {"id": "plain", "from": "A", "to": "B"},
        {"id": "j", "from": "B", "to": "C",
         "synchronization": {"strategy": "all", "sibling_group": "plain"}},
    ]  # fmt: skip
    assert _error(data).path == "transitions[1].synchronization.sibling_group"


def test_m_of_n_larger_than_the_fan_out_is_rejected() -> None:
    """m_of_n above spawn_count can never be satisfied."""
    data = _with()
    data["nodes"].append({"id": "C", "action_id": "act"})
    data["transitions"].append(
        {"id": "j", "from": "B", "to": "C",
         "synchronization": {"strategy": {"m_of_n": 4}, "sibling_group": "fan"}}
    )  # fmt: skip
    assert _error(data).path == "transitions[1].synchronization.strategy.m_of_n"


def test_retry_without_a_timeout_is_rejected() -> None:
    """on_timeout: retry with no timeout to retry after cannot be computed."""
    data = _with()
    data["nodes"][0]["on_timeout"] = "retry"
    assert _error(data).path == "nodes[0].on_timeout"


def test_retry_with_an_action_timeout_is_accepted() -> None:
    """The action's execution timeout gives retry a limit; max_retries defaults to 3."""
    data = _with()
    data["actions"][0]["execution"] = {"timeout_ms": 1000}
    data["nodes"][0]["on_timeout"] = "retry"
    d = wf.parse_definition(data)
    assert (d.node_on_timeout(d.nodes["A"]), d.nodes["A"].max_retries) == ("retry", 3)


def test_node_timeout_overrides_action_timeout_even_when_null() -> None:
    """Node > action: a node's explicit null removes the action's timeout."""
    data = _with()
    data["actions"][0]["execution"] = {"timeout_ms": 1000}
    data["nodes"][1]["timeout_ms"] = None
    d = wf.parse_definition(data)
    assert (d.node_timeout_ms(d.nodes["A"]), d.node_timeout_ms(d.nodes["B"])) == (1000, None)


def test_sync_timeout_default_is_computed_from_the_branch() -> None:
    """D6.2: min(max action timeout x spawn count x 1.5, 1_800_000)."""
    data = _with()
    data["nodes"][1]["timeout_ms"] = 1000
    data["nodes"].append({"id": "C", "action_id": "act", "timeout_ms": 999_999})
    data["transitions"].append(
        {
            "id": "j",
            "from": "B",
            "to": "C",
            "synchronization": {"strategy": "all", "sibling_group": "fan"},
        }
    )
    d = wf.parse_definition(data)
    assert d.sync_timeout_ms(d.transitions["j"], 3) == 4500


def test_sync_timeout_default_is_capped_and_has_a_fallback() -> None:
    """D6.2: the cap, and 1_800_000 with nothing to compute from."""
    data = _with()
    data["nodes"].append({"id": "C", "action_id": "act"})
    data["transitions"].append(
        {
            "id": "j",
            "from": "B",
            "to": "C",
            "synchronization": {"strategy": "all", "sibling_group": "fan"},
        }
    )
    assert (
        wf.parse_definition(data).sync_timeout_ms(wf.parse_definition(data).transitions["j"], 3)
        == 1_800_000
    )
    data["nodes"][1]["timeout_ms"] = 1_000_000
    d = wf.parse_definition(data)
    assert d.sync_timeout_ms(d.transitions["j"], 3) == 1_800_000


def test_yaml_text_and_json_text_parse_alike(tmp_path: Path) -> None:
    """JSON text, YAML text and a YAML file give the same definition."""
    import yaml

    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(BASE))
    a = wf.parse_definition(json.dumps(BASE))
    b = wf.parse_definition(yaml.safe_dump(BASE))
    c = wf.parse_definition(path)
    assert a.raw == b.raw == c.raw


def test_yaml_alias_bomb_is_refused() -> None:
    """YAML aliases (the billion-laughs expansion) are refused before expansion."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
    bomb += "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nid: x\n"
    assert "aliases" in str(_error(bomb))


def test_deeply_nested_json_is_a_definition_error() -> None:
    """Nesting beyond the recursion limit is reported as too deep (D6.20), with its path."""
    err = _error("[" * 100_000 + "]" * 100_000)
    assert "nested deeper than the limit of 64 levels" in str(err)
    assert err.code == "too-deep" and err.path == "[0]" * 64


def test_invalid_yaml_is_reported() -> None:
    """Broken YAML gives a DefinitionError that says YAML."""
    assert "not valid YAML" in str(_error("id: [unclosed\n  nodes"))


def test_invalid_json_is_reported() -> None:
    """Broken JSON gives a DefinitionError that says JSON."""
    assert "not valid JSON" in str(_error('{"id": '))


def test_missing_file_is_reported(tmp_path: Path) -> None:
    """A path that does not exist is named."""
    assert "cannot read" in str(_error(tmp_path / "absent.yaml"))


def test_non_object_definition_is_rejected() -> None:
    """A YAML scalar is not a definition."""
    assert "is not of type 'object'" in str(_error("just a string"))


def test_wrong_type_definition_argument_is_rejected() -> None:
    """A number is not a definition source."""
    assert "not int" in str(_error(42))


def test_oversized_text_is_refused() -> None:
    """Text larger than the limit is refused before parsing."""
    assert "larger than" in str(_error("#" + "x" * (5 * 1024 * 1024) + "\n"))


def test_ids_with_control_characters_are_rejected() -> None:
    """Identifiers are restricted to a safe alphabet."""
    assert _error(_with(id="a\nb")).path == "id"


def test_duplicate_node_ids_are_rejected() -> None:
    """Two nodes with one id name the second."""
    data = _with()
    data["nodes"][1]["id"] = "A"
    assert _error(data).path == "nodes[1].id"


def test_deferred_kind_needs_a_handler_and_a_module() -> None:
    """A deferred action names the handler that starts it and the connector module that polls it."""
    data = _with()
    data["actions"][0] = {"id": "act", "kind": "deferred", "implementation": {}}
    assert _error(data).path == "actions[0].implementation"


def test_python_action_implementation_is_checked() -> None:
    """A python action without a handler name names the implementation."""
    data = _with()
    data["actions"][0]["implementation"] = {"handle": "x"}
    assert _error(data).path.startswith("actions[0].implementation")


def test_two_joins_on_one_group_are_rejected() -> None:
    """One fan-out is joined once."""
    data = _with()
    data["nodes"].append({"id": "C", "action_id": "act"})
    join = {"strategy": "all", "sibling_group": "fan"}
    data["transitions"] += [
        {"id": "j1", "from": "B", "to": "C", "synchronization": join},
        {"id": "j2", "from": "B", "to": "C", "synchronization": join},
    ]
    assert _error(data).path == "transitions[2].synchronization.sibling_group"


def test_schema_is_shipped_and_rejects_additional_properties() -> None:
    """The shipped schema closes every object."""
    s = wf.schema()
    assert s["additionalProperties"] is False
    assert all(d.get("additionalProperties") is False for k, d in s["$defs"].items()
               if d.get("type") == "object")  # fmt: skip


def test_definition_error_pickles() -> None:
    """DefinitionError survives pickling with its path."""
    import pickle

    err = pickle.loads(pickle.dumps(_error(_with(initial_node="Z"))))
    assert err.path == "initial_node" and "Z" in str(err)


DOCUMENTED_EXAMPLE = """
id: research                  # definition id
version: 1                    # optional, default 1; runs keep the version they started with
timeout_ms: 3600000           # absent: 1 h (D6.1); null: no workflow timeout
on_timeout: cancel_all        # cancel_all (default) | fail
initial_node: A
actions:
  - id: act1
    kind: python              # python | http_request | workflow_call | deferred
    implementation: {handler: fetch}          # python: a registered handler name
    execution: {timeout_ms: 120000, on_timeout: fail}
  - id: research_action
    kind: workflow_call
    implementation: {workflow_def_id: research-child}
  - id: call_api
    kind: http_request
    implementation: {method: POST, url: "http://127.0.0.1:9000/score"}
nodes:
  - {id: A, action_id: act1, timeout_ms: 300000, on_timeout: retry, max_retries: 3}
  - {id: B, action_id: act1}
  - {id: C, action_id: research_action, timeout_ms: 1800000, inherit_deadline: false}
transitions:
  - {id: fan, from: A, to: B, spawn_count: 3}         # or foreach: input.items (a path)
  - id: join
    from: B
    to: C
    synchronization:
      strategy: all                                   # all | any | {m_of_n: 2}
      sibling_group: fan
      timeout_ms: 5000                                # optional: computed default, D6.2
      on_timeout: proceed_with_available              # | fail
      merge: {source: _branch.output, target: state.results, strategy: append}
"""


def test_the_documented_example_parses_as_written() -> None:
    """A definition with every field commented is valid as written."""
    d = wf.parse_definition(DOCUMENTED_EXAMPLE)
    join = d.transitions["join"].synchronization
    assert join is not None and (join.strategy, join.timeout_ms) == ("all", 5000)
    assert d.node_on_timeout(d.nodes["A"]) == "retry" and d.node_timeout_ms(d.nodes["B"]) == 120000


def test_the_sync_default_worked_example_holds() -> None:
    """D6.2's worked example: 10 tokens of a 2-minute action wait 30 minutes by default."""
    data = copy.deepcopy(BASE)
    data["actions"][0]["execution"] = {"timeout_ms": 120_000}
    data["nodes"].append({"id": "C", "action_id": "act"})
    data["transitions"][0]["spawn_count"] = 10
    data["transitions"].append(
        {
            "id": "j",
            "from": "B",
            "to": "C",
            "synchronization": {"strategy": "all", "sibling_group": "fan"},
        }
    )
    d = wf.parse_definition(data)
    assert d.sync_timeout_ms(d.transitions["j"], 10) == 1_800_000


@pytest.mark.parametrize("where", ["id", "node"])
def test_an_identifier_ending_in_a_newline_is_refused(where: str) -> None:
    """A pattern's "$" ends the string (ECMA-262), so "research\\n" is not an identifier."""
    data = _with(id="research\n") if where == "id" else _with()
    if where == "node":
        data["nodes"][1]["id"] = "B\n"
    err = _error(data)
    assert err.path == ("id" if where == "id" else "nodes[1].id")
    assert "does not match" in str(err)
