"""The host's browser-facing defences over raw HTTP against real host processes: the Host
allow-list (DNS rebinding, D8.5), same-origin checks and the session-bound CSRF token (D8.4),
cookies and caching (D8.8, D8.9), sign-out and the sign-in throttle (D8.7), ``Allow`` on 405."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .conftest import Server, csrf_of, launch, stop

JSON = {"content-type": "application/json"}


def _problem(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    detail: str = r.json()["detail"]
    return detail


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


# Host allow-list (D8.5) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/runs"), ("GET", "/ui/"), ("GET", "/metrics")]
)
def test_a_rebound_name_reads_nothing(host: Server, method: str, path: str) -> None:
    """A request whose Host is a name the host does not answer to (what a DNS-rebinding page's
    requests carry) is a 421 problem naming it."""
    r = host.client.request(method, path, headers={"Host": f"rebind.example:{_port(host)}"})
    assert "'rebind.example:" in _problem(r, 421)


def test_a_rebound_name_starts_nothing(host: Server) -> None:
    """A start through a rebound name is refused and no run appears."""
    before = [run["id"] for run in host.client.get("/v1/runs").json()["runs"]]
    r = host.client.post(
        "/v1/workflows/quick/runs",
        json={"input": {}},
        headers={"Host": f"rebind.example:{_port(host)}"},
    )
    _problem(r, 421)
    assert [run["id"] for run in host.client.get("/v1/runs").json()["runs"]] == before


@pytest.mark.parametrize("name", ["localhost", "app.localhost", "127.0.0.1", "[::1]", "10.1.2.3"])
def test_loopback_names_and_addresses_are_answered(host: Server, name: str) -> None:
    """Loopback names and IP addresses (nothing there to rebind) are answered."""
    r = host.client.get("/healthz", headers={"Host": f"{name}:{_port(host)}"})
    assert r.status_code == 200


def test_configured_names_are_answered(tmp_path: Path) -> None:
    """--allowed-host adds a name (any letter case, with or without the port)."""
    server = launch(tmp_path, "--allowed-host", "ops.example.com")
    try:
        for host in ("ops.example.com", "OPS.example.com:443", "ops.example.com."):
            assert server.client.get("/v1/runs", headers={"Host": host}).status_code == 200
        assert server.client.get("/v1/runs", headers={"Host": "x.example.com"}).status_code == 421
    finally:
        stop(server)


# Same origin and CSRF (D8.4) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://rebind.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_state_changing_calls_from_other_origins_are_refused(
    host: Server, headers: dict[str, str]
) -> None:
    """A start whose Origin is another origin, or whose Sec-Fetch-Site is not same-origin, is a
    403 problem."""
    r = host.client.post("/v1/workflows/quick/runs", json={"input": {}}, headers=headers)
    _problem(r, 403)


def test_another_port_of_the_same_machine_is_another_origin(host: Server) -> None:
    """Origin http://127.0.0.1:<other port> is refused; the host's own origin is accepted."""
    port = _port(host)
    other = host.client.post(
        "/v1/workflows/quick/runs",
        json={"input": {}},
        headers={"Origin": f"http://127.0.0.1:{port + 1}"},
    )
    _problem(other, 403)
    own = host.client.post(
        "/v1/workflows/quick/runs", json={"input": {}}, headers={"Origin": host.url}
    )
    assert own.status_code == 201


@pytest.mark.parametrize(
    "media", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"]
)
def test_body_less_api_posts_refuse_what_forms_send(host: Server, media: str) -> None:
    """cancel, poll-now and the deferred cancel take JSON or nothing: a form's media type (which
    a page of another site may send without asking) is a 415, and the run goes on."""
    run_id = host.start("quick", {"sleep_s": 30})
    for path in (
        f"/v1/runs/{run_id}/cancel",
        "/v1/deferred-operations/x/poll",
        "/v1/deferred-operations/x/cancel",
    ):
        r = host.client.post(path, content=b"a=1", headers={"content-type": media})
        _problem(r, 415)
    assert host.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "running"
    assert host.client.post(f"/v1/runs/{run_id}/cancel").status_code == 200


def test_a_tossed_cookie_and_matching_field_do_not_pass_the_csrf_check(host: Server) -> None:
    """Without any Origin header, a form post carrying a session id and CSRF value the attacker
    chose (the same value in the old double-submit cookie) is a 403: the token is bound to the
    id by a key only the host knows."""
    run_id = host.start("quick", {"sleep_s": 30})
    tossed = "t" * 43
    with httpx.Client(
        base_url=host.url, cookies={"tb_session": tossed, "tb_csrf": tossed}
    ) as victim:
        r = victim.post(f"/ui/runs/{run_id}/cancel", data={"csrf": tossed})
    _problem(r, 403)
    assert host.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "running"
    host.client.post(f"/v1/runs/{run_id}/cancel")


def test_a_page_token_works_only_with_its_own_session_cookie(host: Server) -> None:
    """The CSRF token of one browser's page is refused with another browser's cookie."""
    run_id = host.start("quick", {"sleep_s": 30})
    with httpx.Client(base_url=host.url) as mine, httpx.Client(base_url=host.url) as theirs:
        token = csrf_of(mine.get(f"/ui/runs/{run_id}").text)
        theirs.get(f"/ui/runs/{run_id}")
        _problem(theirs.post(f"/ui/runs/{run_id}/cancel", data={"csrf": token}), 403)
        assert mine.post(f"/ui/runs/{run_id}/cancel", data={"csrf": token}).status_code == 303
    assert host.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "cancelled"


# Caching and 405 (D8.8) ---------------------------------------------------------------------


def test_pages_and_run_data_are_not_stored_by_caches(host: Server) -> None:
    """UI pages, API answers and problems say Cache-Control: no-store; static files do not."""
    run_id = host.start("quick", {})
    for path in ("/ui/", f"/ui/runs/{run_id}", f"/v1/runs/{run_id}", "/v1/runs", "/v1/nowhere"):
        assert host.client.get(path).headers["cache-control"] == "no-store", path
    assert "cache-control" not in host.client.get("/ui/static/host.css").headers


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/runs", "GET, HEAD"),
        ("GET", "/v1/runs/x/cancel", "POST"),
        ("POST", "/v1/definitions/x", "PUT"),
        ("DELETE", "/ui/login", "GET, HEAD, POST"),
        ("PUT", "/ui/traces", "GET, HEAD, POST"),
        ("POST", "/ui/static/host.css", "GET, HEAD"),
        ("POST", "/healthz", "GET, HEAD"),
    ],
)
def test_every_405_says_what_is_allowed(host: Server, method: str, path: str, allow: str) -> None:
    """A 405 carries Allow with every method the path serves (over all its routes)."""
    r = host.client.request(method, path)
    _problem(r, 405)
    assert r.headers["allow"] == allow


# Sessions (D8.7) and cookies (D8.9) -------------------------------------------------------


def _sign_in(server: Server, client: httpx.Client) -> httpx.Response:
    csrf = csrf_of(client.get("/ui/login").text)
    return client.post("/ui/login", data={"csrf": csrf, "token": server.token})


def test_sign_out_ends_the_session_on_the_host(secured: Server) -> None:
    """After sign-out the old session id opens nothing, even when a client sends it again."""
    with httpx.Client(base_url=secured.url) as browser:
        assert _sign_in(secured, browser).status_code == 303
        session = browser.cookies["tb_session"]
        csrf = csrf_of(browser.get("/ui/").text)
        r = browser.post("/ui/logout", data={"csrf": csrf})
        assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
        assert "tb_session" not in browser.cookies
    with httpx.Client(base_url=secured.url, cookies={"tb_session": session}) as replay:
        assert replay.get("/ui/").headers["location"] == "/ui/login"


def test_sign_in_gives_a_new_session_id(secured: Server) -> None:
    """The id a browser had before signing in is not its session afterwards (fixation)."""
    with httpx.Client(base_url=secured.url) as browser:
        browser.get("/ui/login")
        before = browser.cookies["tb_session"]
        _sign_in(secured, browser)
        assert browser.cookies["tb_session"] != before
    with httpx.Client(base_url=secured.url, cookies={"tb_session": before}) as planted:
        assert planted.get("/ui/").status_code == 303


def test_a_blank_token_does_not_sign_in(secured: Server) -> None:
    """The sign-in form refuses a whitespace-only token (401)."""
    with httpx.Client(base_url=secured.url) as browser:
        csrf = csrf_of(browser.get("/ui/login").text)
        assert browser.post("/ui/login", data={"csrf": csrf, "token": "   "}).status_code == 401


def test_the_session_cookie_reads_only_the_event_stream(secured: Server) -> None:
    """A signed-in session reads a run's events without a Bearer header, but no other API
    route, and not from another site's page."""
    run_id = secured.start("quick", {})
    secured.wait_run(run_id)
    with httpx.Client(base_url=secured.url) as browser:
        _sign_in(secured, browser)
        assert browser.get(f"/v1/runs/{run_id}/events").status_code == 200
        assert browser.get(f"/v1/runs/{run_id}").status_code == 401
        cross = browser.get(f"/v1/runs/{run_id}/events", headers={"Sec-Fetch-Site": "same-site"})
        assert cross.status_code == 401


@pytest.fixture
def proxied(tmp_path: Path) -> Callable[..., Server]:
    started: list[Server] = []

    def make(*args: str) -> Server:
        where = tmp_path / str(len(started))
        where.mkdir()
        server = launch(where, *args, token="proxy-token-0123456789")
        started.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in started:
        stop(server)


def test_behind_a_trusted_tls_proxy_the_cookie_is_host_prefixed_and_secure(
    proxied: Callable[..., Server],
) -> None:
    """With --forwarded-allow-ips naming the proxy, X-Forwarded-Proto: https makes the session
    cookie __Host-tb_session, Secure, Path=/; the form's post from https works."""
    server = proxied("--forwarded-allow-ips", "127.0.0.1")
    with httpx.Client(base_url=server.url, headers={"X-Forwarded-Proto": "https"}) as browser:
        page = browser.get("/ui/login")
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("__Host-tb_session=")
        assert "Secure" in cookie and "Path=/" in cookie and "HttpOnly" in cookie
        assert "Domain" not in cookie
        browser.cookies.set("__Host-tb_session", browser.cookies["__Host-tb_session"])
        r = browser.post(
            "/ui/login",
            data={"csrf": csrf_of(page.text), "token": server.token},
            headers={"Origin": "https://" + server.url.split("://")[1]},
        )
        assert r.status_code == 303
        assert r.headers["set-cookie"].startswith("__Host-tb_session=")


def test_forwarded_headers_of_an_untrusted_client_are_ignored(
    proxied: Callable[..., Server],
) -> None:
    """Without --forwarded-allow-ips, X-Forwarded-Proto changes nothing: plain tb_session."""
    server = proxied()
    with httpx.Client(base_url=server.url, headers={"X-Forwarded-Proto": "https"}) as browser:
        cookie = browser.get("/ui/login").headers["set-cookie"]
    assert cookie.startswith("tb_session=") and "Secure" not in cookie


def test_sign_in_attempts_are_rate_limited_per_address(proxied: Callable[..., Server]) -> None:
    """After five attempts from one address the sixth is a 429 problem with Retry-After, even
    with the right token; another address (through the trusted proxy) still signs in."""
    server = proxied("--forwarded-allow-ips", "127.0.0.1")
    with httpx.Client(base_url=server.url, headers={"X-Forwarded-For": "192.0.2.7"}) as guesser:
        csrf = csrf_of(guesser.get("/ui/login").text)
        for _ in range(5):
            r = guesser.post("/ui/login", data={"csrf": csrf, "token": "wrong-guess"})
            assert r.status_code == 401
        r = guesser.post("/ui/login", data={"csrf": csrf, "token": server.token})
        assert "too many sign-in attempts from 192.0.2.7" in _problem(r, 429)
        assert 1 <= int(r.headers["retry-after"]) <= 60
    with httpx.Client(base_url=server.url, headers={"X-Forwarded-For": "192.0.2.8"}) as other:
        assert _sign_in(server, other).status_code == 303
