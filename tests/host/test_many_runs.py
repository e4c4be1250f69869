"""A store with 10,000 runs: the API and the UI page through them, a page at a time, over HTTP
and in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from .browser import browser, page
from .conftest import QUICK, Server, launch, stop

__all__ = ["browser", "page"]  # fixtures, used by name

RUNS = 10_000
PAGE = 50  # the host's default page_size


async def _fill(db: str) -> None:
    from timebound import workflow as wf

    def noop(ctx: Any) -> None:
        return None

    definition = {**QUICK, "id": "many"}
    definition["actions"] = [
        {"id": "work", "kind": "python", "implementation": {"handler": "noop"}}
    ]
    engine = wf.Engine(db=db, actions={"noop": noop})
    engine.register(definition)
    async with engine:
        # Started together: the engine commits concurrent starts in shared transactions.
        ids = await asyncio.gather(*(engine.start("many") for _ in range(RUNS)))
        await engine.cancel(ids[0])  # one run whose state differs, for the filter
    assert len(set(ids)) == RUNS


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A host over a store holding 10,000 runs of "many" (one of them cancelled)."""
    tmp = tmp_path_factory.mktemp("many")
    asyncio.run(_fill(f"sqlite:///{tmp}/host.db"))
    (tmp / "flows").mkdir()
    (tmp / "flows" / "many.json").write_text(
        json.dumps(
            {
                **QUICK,
                "id": "many",
                # Another body than the stored version 1's: a new body needs a new version.
                "version": 2,
                "actions": [
                    {"id": "work", "kind": "python", "implementation": {"handler": "work"}}
                ],
            }
        )
    )
    server = launch(tmp)
    try:
        yield server
    finally:
        stop(server)


def test_ten_thousand_runs_are_served_a_page_at_a_time(many: Server) -> None:
    """Both the API and /ui/ answer one page (50 rows) with a next cursor, and a status filter
    finds the one cancelled run among 10,000."""
    page = many.client.get("/v1/runs", params={"definition": "many"}).json()
    assert len(page["runs"]) == PAGE and page["next_cursor"] is not None
    ui = many.client.get("/ui/")
    assert ui.status_code == 200
    assert ui.text.count('<td><a href="/ui/runs/') == PAGE
    assert 'rel="next"' in ui.text and 'rel="prev"' not in ui.text
    cancelled = many.client.get("/v1/runs", params={"status": "cancelled"}).json()
    assert [r["status"] for r in cancelled["runs"]] == ["cancelled"]


def test_a_back_trail_the_host_did_not_give_out_is_refused(many: Server) -> None:
    """The runs list's ``back`` cursors are checked like ``cursor`` (400, never a 500)."""
    r = many.client.get("/ui/", params={"back": "not-a-cursor"})
    assert r.status_code == 400
    assert r.json()["detail"] == "cursor: not a cursor this host gave out"


def test_previous_links_reach_back_a_hundred_pages_then_only_first(many: Server) -> None:
    """Deep in the list the trail of earlier pages stops growing at 100 cursors: the oldest are
    cut (``~``), and a page whose trail is only the cut offers "First page" but no "Previous"."""
    cursors: list[str] = []
    cursor = None
    while len(cursors) < 102:  # the API's cursors are the UI's
        params = {"cursor": cursor} if cursor else {}
        cursor = many.client.get("/v1/runs", params=params).json()["next_cursor"]
        cursors.append(cursor)
    deep = many.client.get("/ui/", params={"cursor": cursors[101], "back": ".".join(cursors[:101])})
    assert deep.status_code == 200
    next_back = re.search(r'href="/ui/\?cursor=[^"&]+&amp;back=([^"]+)" rel="next"', deep.text)
    assert next_back is not None
    trail = next_back[1].split(".")
    assert len(trail) == 100 and trail[0] == "~" and trail[1:] == cursors[3:102]
    cut = many.client.get("/ui/", params={"cursor": cursors[3], "back": "~"})
    assert cut.status_code == 200
    assert 'rel="prev"' not in cut.text and 'class="first" href="/ui/"' in cut.text


def _ids(page: Any) -> list[str]:
    ids: list[str] = page.locator("table.runs tbody td:first-child a").all_inner_texts()
    return ids


def _tab_to(page: Any, selector: str, limit: int = 200) -> None:
    """Press Tab until the element matching ``selector`` has the focus."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("s => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"{selector} is not reachable by keyboard")


def _follow(page: Any) -> str:
    """Press Enter on the focused link or button and wait for the page it leads to."""
    with page.expect_navigation():
        page.keyboard.press("Enter")
    url: str = page.url
    return url


def test_the_runs_list_of_ten_thousand_runs_in_a_browser(
    many: Server, page: Any, record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chromium loads /ui/ over 10,000 runs: one page of 50 rows in the DOM; Next and Previous,
    followed by keyboard, move a page each way and back; the status filter, set by keyboard,
    finds the one cancelled run. The page's DOM-content-loaded time is reported (no threshold:
    the machine's load decides it)."""
    timings = []
    for _ in range(2):  # the first load also warms the host's templates and the store's pages
        page.goto(many.url + "/ui/", timeout=60_000)
        timings.append(
            page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
        )
    record_property("ui_dom_content_loaded_ms_10000_runs", [round(t, 1) for t in timings])
    with capsys.disabled():  # a measurement for the reader, shown even when output is captured
        print(
            f"\n/ui/ over {RUNS} runs: DOM content loaded after {timings[0]:.1f} ms "
            f"(first load), {timings[1]:.1f} ms (again)"
        )
    assert page.locator("table.runs tbody tr").count() == PAGE
    first = _ids(page)
    assert page.locator("a[rel=prev]").count() == 0

    _tab_to(page, "a[rel=next]")
    assert "cursor=" in _follow(page)
    second = _ids(page)
    assert len(second) == PAGE and not set(second) & set(first)

    _tab_to(page, "a[rel=next]")
    assert "back=" in _follow(page)
    third = _ids(page)
    assert len(third) == PAGE and not set(third) & (set(first) | set(second))

    _tab_to(page, "a[rel=prev]")
    assert "back=" not in _follow(page)
    assert _ids(page) == second
    _tab_to(page, "a[rel=prev]")
    assert _follow(page) == many.url + "/ui/"
    assert _ids(page) == first

    _tab_to(page, "#status")
    while page.evaluate("document.getElementById('status').value") != "cancelled":
        page.keyboard.press("ArrowDown")
    _tab_to(page, "button[type=submit]")
    assert _follow(page).endswith(
        "/ui/?status=cancelled&definition=&bound=&since=&until=&q=&input="
    )
    assert page.locator("table.runs tbody .badge").all_inner_texts() == ["cancelled"]
    assert page.locator("nav.pages").count() == 0
