"""The operator UI in real headless Chromium (Debian's package, driven by Playwright)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .browser import DOCS_IMG, browser, page, pixels, screenshots_wanted
from .conftest import Server

__all__ = ["browser", "page"]  # fixtures, used by name

# The screenshot docs/host.md shows (retaken with TIMEBOUND_UPDATE_SCREENSHOTS=1).
DOC_SCREENSHOT = DOCS_IMG / "host-run.png"


def test_runs_list_shows_runs_and_filters_by_status(host: Server, page: Any) -> None:
    """The list shows runs; choosing status=failed keeps only failed ones."""
    host.wait_run(host.start("quick", {}))
    host.wait_run(host.start("bounded", {"sleep_s": 30}))
    page.goto(host.url + "/ui/")
    assert page.locator("table.runs tbody tr").count() >= 2
    page.select_option("#status", "failed")
    page.click("text=Filter")
    page.wait_for_url("**/ui/?status=failed*")
    badges = page.locator("table.runs tbody .badge").all_inner_texts()
    assert badges and set(badges) == {"failed"}


def test_run_page_timeline_marks_the_timeout_and_the_bound(host: Server, page: Any) -> None:
    """A timed-out node's bar is drawn, labelled with its layer, and the bound is named."""
    run_id = host.start("bounded", {"sleep_s": 30})
    host.wait_run(run_id)
    page.goto(f"{host.url}/ui/runs/{run_id}")
    assert page.inner_text("#bound-fired") == (
        "node bound on node a (200ms set by the node a, policy fail)"
    )
    bar = page.locator(".timeline .bar.timed_out")
    what, took = bar.inner_text().splitlines()
    # Its duration is beside it: at least the 200 ms bound (never early), then the bound's layer.
    length, layer = took.split(" · ")
    assert what == "attempt 1: timed_out" and layer == "node bound"
    # The one duration text (D1.14): "201ms", or "1.2s" on a busy machine.
    ms = float(length[:-2]) if length.endswith("ms") else float(length[:-1]) * 1000
    assert ms >= 200
    box = bar.bounding_box()
    assert box["width"] > 100 and box["height"] > 10


def test_timeline_screenshot_shows_the_timed_out_bar(
    host: Server, page: Any, tmp_path: Path
) -> None:
    """The rendered timeline's pixels contain the timed-out colour (#e8890c)."""
    run_id = host.start("bounded", {"sleep_s": 30})
    host.wait_run(run_id)
    page.goto(f"{host.url}/ui/runs/{run_id}")
    png = page.locator("#timeline").screenshot(path=str(tmp_path / "timeline.png"))
    assert (0xE8, 0x89, 0x0C) in set(pixels(png))


def test_fan_out_timeline_shows_branches_and_the_join_bound(
    host: Server, page: Any, tmp_path: Path
) -> None:
    """A fan-out draws one lane per branch, the join as a marker, and names the
    synchronization bound; the slow branch's attempt is drawn cut by that bound."""
    run_id = host.start("fanout", {"delays": [0.05, 0.1, 30]})
    assert host.wait_run(run_id)["run"]["status"] == "completed"
    page.goto(f"{host.url}/ui/runs/{run_id}")
    labels = page.locator(".timeline .label").all_inner_texts()
    assert labels == ["start", "probe[0]", "probe[1]", "probe[2]", "report"]
    assert page.locator(".timeline .marker.join_timed_out").count() == 1
    assert page.inner_text("#bound-fired") == (
        "synchronization bound at join join "
        "(400ms set by the join join, policy proceed_with_available)"
    )
    # The slow branch's attempt was cut by the join's bound (then its token cancelled): drawn
    # in the timed-out colour, with the bound that cut it beside it.
    cut = page.locator(".timeline .bar.attempt.timed_out")
    assert cut.count() == 1 and "synchronization bound" in cut.inner_text()
    png = page.locator("#timeline").screenshot(path=str(tmp_path / "fanout.png"))
    assert (0xE8, 0x89, 0x0C) in set(pixels(png))
    if screenshots_wanted():
        page.screenshot(path=str(DOC_SCREENSHOT), full_page=True)


def test_run_page_follows_events_live_until_the_end(host: Server, page: Any) -> None:
    """A running run's page lists its events as they happen and sees the run end."""
    run_id = host.start("quick", {"sleep_s": 0.5})
    page.goto(f"{host.url}/ui/runs/{run_id}")
    page.wait_for_selector("#events[data-live=ended]", timeout=20_000)
    texts = page.locator("#events li").all_inner_texts()
    assert "run_started" in texts[0]
    assert "run_completed" in texts[-1]


def test_cancel_from_the_run_page(host: Server, page: Any) -> None:
    """The cancel button (a CSRF-protected form) cancels a running run."""
    run_id = host.start("quick", {"sleep_s": 30})
    page.goto(f"{host.url}/ui/runs/{run_id}")
    page.click("text=Cancel run")
    page.wait_for_url(f"**/ui/runs/{run_id}")
    assert page.inner_text("#run-status") == "cancelled"


def test_keyboard_reaches_and_opens_a_run(host: Server, page: Any) -> None:
    """Tab moves through skip link, filters and run links; Enter on a run link opens it."""
    run_id = host.start("quick", {})
    host.wait_run(run_id)
    page.goto(host.url + "/ui/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    for _ in range(60):  # past the filters (a date-time field has a stop per part)
        page.keyboard.press("Tab")
        href = page.evaluate("document.activeElement.getAttribute('href') || ''")
        if href.startswith("/ui/runs/"):
            break
    else:
        raise AssertionError("no run link reachable by keyboard")
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui/runs/*")
    assert page.locator("h1").inner_text().startswith("Run ")


def test_login_page_guards_the_ui(secured: Server, page: Any) -> None:
    """With a token, the UI asks for it first and then shows the runs."""
    page.goto(secured.url + "/ui/")
    page.wait_for_url("**/ui/login")
    page.fill("#token", "wrong")
    page.click("button:has-text('Sign in')")
    assert page.locator(".error").inner_text() == "That token is not valid."
    page.fill("#token", secured.token)
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui/")
    assert page.locator("h1").inner_text() == "Runs"
