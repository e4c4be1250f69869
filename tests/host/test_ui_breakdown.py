"""The run page says where a timed-out node's budget went (D13.7), in real headless Chromium."""

from __future__ import annotations

import re
from typing import Any

from .browser import browser, page
from .conftest import Server

__all__ = ["browser", "page"]  # fixtures, used by name


def _ms(text: str) -> float:
    """A duration as the page prints it (``134.218ms``, ``200 ms``, ``1.5s``), in ms."""
    m = re.fullmatch(r"([\d.]+)\s*(ms|s)", text.strip())
    assert m is not None, text
    return float(m.group(1)) * (1 if m.group(2) == "ms" else 1000)


def test_run_page_shows_where_the_budget_went(host: Server, page: Any) -> None:
    run_id = host.start("bounded", {"sleep_s": 30})
    host.wait_run(run_id)
    page.goto(f"{host.url}/ui/runs/{run_id}")
    page.wait_for_selector("#budget-parts", timeout=10_000)
    assert page.inner_text("#budget-h") == "Where the budget went"
    rows = page.locator("#budget-parts tbody tr")
    first = rows.nth(0).locator("td").all_inner_texts()
    # The node's 200 ms bound, from the handler's start to its firing: what was left of it
    # when the handler began (the dispatch before came off it), all of it used (never early).
    assert first[0] == "bound node workflow node 'a'"
    took, budget = _ms(first[1]), _ms(first[2])
    assert 0 < budget <= 200 and took >= budget
    # The handler only slept: its own code is the one part, and it is indented under the bound;
    # how late the bound fired after its deadline, if at all, is a part of its own (D13.9).
    kinds = [c.split()[-1] for c in rows.evaluate_all("rs => rs.map(r => r.className)")]
    assert kinds in (["bound", "self"], ["bound", "self", "late"])
    pad = [
        rows.nth(i).locator("td").first.evaluate("td => getComputedStyle(td).paddingLeft")
        for i in range(2)
    ]
    assert float(pad[1].removesuffix("px")) > float(pad[0].removesuffix("px"))
