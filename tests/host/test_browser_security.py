"""Attacks through the operator's own browser (headless Chromium): a page on another port of the
same machine tosses cookies and posts forms at the host (D8.4, D8.5), and a signed-in run page
shows its events although EventSource cannot send a Bearer header (D8.7)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from .browser import ARGS, CHROMIUM, browser, page
from .conftest import Server

__all__ = ["browser", "page"]  # fixtures, used by name


class Attacker:
    """A web server on another port of 127.0.0.1 serving the page a test gives it."""

    def __init__(self) -> None:
        self.html = ""
        attacker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = attacker.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="attacker")
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    served = Attacker()
    try:
        yield served
    finally:
        served.close()


def _attack(page: Any, attacker: Attacker, html: str, target: str) -> Any:
    """Open the attacker's page in the operator's browser; answer the host's reply to its post."""
    attacker.html = html
    with page.expect_response(lambda r: r.url == target, timeout=20_000) as reply:
        page.goto(attacker.url + "/")
    return reply.value


def test_cookie_tossing_from_another_port_cannot_cancel_a_run(
    host: Server, page: Any, attacker: Attacker
) -> None:
    """A page on another port plants the host's cookies (a CSRF cookie and a session id) and
    posts the cancel form with a matching field: refused (403), the run goes on."""
    run_id = host.start("quick", {"sleep_s": 30})
    target = f"{host.url}/ui/runs/{run_id}/cancel"
    tossed = "t" * 43  # the shape of a session id the host makes
    html = f"""<!doctype html><body>
    <form id="f" method="post" action="{target}"><input name="csrf" value="{tossed}"></form>
    <script>
      document.cookie = "tb_csrf={tossed}; path=/";
      document.cookie = "tb_session={tossed}; path=/";
      document.getElementById("f").submit();
    </script></body>"""
    reply = _attack(page, attacker, html, target)
    assert reply.status == 403
    assert host.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "running"
    host.client.post(f"/v1/runs/{run_id}/cancel")


@pytest.mark.parametrize("enctype", ["application/x-www-form-urlencoded", "text/plain"])
def test_cross_origin_form_post_cannot_cancel_through_the_api(
    host: Server, page: Any, attacker: Attacker, enctype: str
) -> None:
    """A form on another origin posting to the body-less cancel call of the token-less API is
    refused (403), the run goes on."""
    run_id = host.start("quick", {"sleep_s": 30})
    target = f"{host.url}/v1/runs/{run_id}/cancel"
    html = f"""<!doctype html><body>
    <form id="f" method="post" enctype="{enctype}" action="{target}">
      <input name="x" value="1"></form>
    <script>document.getElementById("f").submit();</script></body>"""
    reply = _attack(page, attacker, html, target)
    assert reply.status == 403
    assert host.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "running"
    host.client.post(f"/v1/runs/{run_id}/cancel")


def test_the_operators_own_cancel_still_works_after_a_tossed_cookie(
    host: Server, page: Any, attacker: Attacker
) -> None:
    """After a page on another port planted a session id, the run page's own cancel button
    (its token bound to whatever id the browser now sends) still cancels."""
    attacker.html = '<script>document.cookie = "tb_session=' + "u" * 43 + '; path=/";</script>'
    page.goto(attacker.url + "/")
    run_id = host.start("quick", {"sleep_s": 30})
    page.goto(f"{host.url}/ui/runs/{run_id}")
    page.click("text=Cancel run")
    page.wait_for_url(f"**/ui/runs/{run_id}")
    assert page.inner_text("#run-status") == "cancelled"


def test_signed_in_run_page_shows_its_events(secured: Server, page: Any) -> None:
    """With a token configured, a signed-in operator's run page follows the run's events over
    the session cookie until the run ends."""
    page.goto(secured.url + "/ui/login")
    page.fill("#token", secured.token)
    page.click("button:has-text('Sign in')")
    page.wait_for_url("**/ui/")
    run_id = secured.start("quick", {"sleep_s": 0.5})
    page.goto(f"{secured.url}/ui/runs/{run_id}")
    page.wait_for_selector("#events[data-live=ended]", timeout=20_000)
    texts = page.locator("#events li").all_inner_texts()
    assert "run_started" in texts[0]
    assert "run_completed" in texts[-1]


def test_sign_out_ends_the_session(secured: Server, page: Any) -> None:
    """The Sign out button ends the session: the UI asks for the token again."""
    page.goto(secured.url + "/ui/login")
    page.fill("#token", secured.token)
    page.click("button:has-text('Sign in')")
    page.wait_for_url("**/ui/")
    page.click("button:has-text('Sign out')")
    page.wait_for_url("**/ui/login")
    page.goto(secured.url + "/ui/")
    page.wait_for_url("**/ui/login")


def test_dns_rebinding_in_the_browser_reads_nothing(host: Server, browser: Any) -> None:
    """A browser that resolves an attacker's name to 127.0.0.1 (as DNS rebinding makes it) gets
    a 421 for the host's pages and API under that name, and their data never reaches the page."""
    port = host.url.rsplit(":", 1)[1]
    rules = "--host-resolver-rules=MAP rebind.test 127.0.0.1"
    # A second Chromium from the same Playwright (one per process), with the resolver rule.
    rebinding = browser.browser_type.launch(executable_path=CHROMIUM, args=[*ARGS, rules])
    try:
        page = rebinding.new_page()
        for path in ("/ui/", "/v1/runs"):
            reply = page.goto(f"http://rebind.test:{port}{path}")
            assert reply is not None and reply.status == 421
            assert json.loads(reply.text())["title"] == "Misdirected Request"
    finally:
        rebinding.close()
