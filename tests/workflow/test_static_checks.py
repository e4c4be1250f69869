"""Definitions that could only fail when run are refused when parsed (D6.19): a join whose
sibling_group names a fan-out that does not reach it, and a foreach path that cannot resolve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from timebound import workflow as wf
from timebound.cli import main

from .test_engine import definition, fan, join


def _two_fan_outs() -> dict[str, Any]:
    """A fans out to B (joined at C) and C fans out to D; the join names the wrong fan-out."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}, {"id": "D"}, {"id": "E"}],
        [
            fan(),
            join(),
            {"id": "fan2", "from": "C", "to": "D", "spawn_count": 2},
            {
                "id": "join2",
                "from": "D",
                "to": "E",
                "synchronization": {"strategy": "all", "sibling_group": "fan"},
            },
        ],
    )
    return d


def test_a_join_naming_another_fan_out_is_refused_with_its_path() -> None:
    """join2 waits on 'fan', whose branches never reach D: refused at sibling_group."""
    d = _two_fan_outs()
    d["transitions"][1]["synchronization"]["sibling_group"] = "fan2"  # swap the groups
    with pytest.raises(wf.DefinitionError) as err:
        wf.parse_definition(d)
    assert err.value.path == "transitions[1].synchronization.sibling_group"
    assert "not reached by that fan-out's branches" in str(err.value)


def test_joins_naming_their_own_fan_outs_pass_also_when_nested() -> None:
    """Each join names the fan-out whose branches reach it; a nested fan-out's join leads back
    into the outer group, whose join is then reached."""
    d = _two_fan_outs()
    d["transitions"][3]["synchronization"]["sibling_group"] = "fan2"
    wf.parse_definition(d)
    nested = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}, {"id": "D"}, {"id": "E"}],
        [
            {"id": "outer", "from": "A", "to": "B", "spawn_count": 2},
            {"id": "inner", "from": "B", "to": "C", "spawn_count": 2},
            {
                "id": "inner_join",
                "from": "C",
                "to": "D",
                "synchronization": {"strategy": "all", "sibling_group": "inner"},
            },
            {
                "id": "outer_join",
                "from": "D",
                "to": "E",
                "synchronization": {"strategy": "all", "sibling_group": "outer"},
            },
        ],
    )
    wf.parse_definition(nested)


@pytest.mark.parametrize("path", ["delays", "items.list", "_branch.output", "state"])
def test_a_foreach_path_that_cannot_resolve_is_refused(path: str) -> None:
    """foreach reads the run's context: a path outside input/state. is refused at its field."""
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    d["transitions"][0]["foreach"] = path
    with pytest.raises(wf.DefinitionError) as err:
        wf.parse_definition(d)
    assert err.value.path == "transitions[0].foreach"
    assert "input" in str(err.value)


@pytest.mark.parametrize("path", ["input", "input.delays", "state.found.items"])
def test_foreach_paths_under_input_or_state_pass(path: str) -> None:
    """input, input.… and state.… are paths a run can resolve."""
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    d["transitions"][0]["foreach"] = path
    wf.parse_definition(d)


def test_workflow_validate_names_the_field(tmp_path: Path, capsys: Any) -> None:
    """`timebound workflow validate` refuses 'foreach: delays' naming the field path."""
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    d["transitions"][0]["foreach"] = "delays"
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(d))
    assert main(["workflow", "validate", str(path)]) == 1
    assert "transitions[0].foreach" in capsys.readouterr().err
