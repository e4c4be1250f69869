"""A timed-out pipeline region says where its budget went (D13)."""

from __future__ import annotations

import pytest

from timebound import pipeline as pl
from timebound.testing import VirtualClock

from . import sample


def test_plan_timeout_carries_the_region_breakdown() -> None:
    reg = sample.make_registry(fetch_features=1.0)
    artifact = pl.compile(sample.make_plan(reg, on_timeout="fail_plan"))
    clock = VirtualClock()
    with pytest.raises(pl.PlanTimeout) as info:
        clock.run(pl.Engine(reg).run(artifact, sample.rows(4)))
    bd = info.value.breakdown
    assert bd is not None, "a region's timeout has a breakdown"
    assert bd.name == "region timeout_wrapper"
    assert bd.elapsed_ms == pytest.approx(2.08)
    assert bd.budget_ms == pytest.approx(2.08)
    nodes = [p for p in bd.parts if p.kind == "node"]
    assert nodes, bd.render()
    # The slow task ran until the region's end and was cut there.
    assert any(p.outcome in ("cancelled", "timed_out", "cut") for p in nodes), bd.render()
    for _, p in bd.walk():
        if p.parts and "parallel" not in (p.outcome or ""):
            assert sum(c.elapsed_ms for c in p.parts) == pytest.approx(p.elapsed_ms)
    assert "went to:" in str(info.value)
