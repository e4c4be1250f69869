"""Auth (D8.1): with a token, the API and the UI need it; the token never shows in logs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .conftest import Server, launch, stop


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong",
        "Bearer",
        "Basic czNjcmV0LXRva2VuLWZvci10ZXN0cw==",
        "s3cret-token-for-tests",
    ],
)
def test_mutating_call_without_the_token_is_refused(
    secured: Server, authorization: str | None
) -> None:
    """A start without a valid Bearer token is 401 and starts nothing."""
    headers = {} if authorization is None else {"Authorization": authorization}
    # Ids only: a run another test started may change status meanwhile; none may appear.
    before = [run["id"] for run in secured.client.get("/v1/runs").json()["runs"]]
    with httpx.Client(base_url=secured.url) as anonymous:
        r = anonymous.post("/v1/workflows/quick/runs", json={"input": {}}, headers=headers)
    assert r.status_code == 401
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert [run["id"] for run in secured.client.get("/v1/runs").json()["runs"]] == before


def test_reads_also_need_the_token(secured: Server) -> None:
    """Runs carry their inputs, so reading them needs the token too."""
    with httpx.Client(base_url=secured.url) as anonymous:
        assert anonymous.get("/v1/runs").status_code == 401


def test_the_right_token_is_accepted(secured: Server) -> None:
    """With the configured token a run starts."""
    r = secured.client.post("/v1/workflows/quick/runs", json={"input": {}})
    assert r.status_code == 201


def test_health_and_metrics_stay_open(secured: Server) -> None:
    """Probes and scrapers need no token."""
    with httpx.Client(base_url=secured.url) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        assert anonymous.get("/metrics").status_code == 200


def test_ui_without_a_session_goes_to_login(secured: Server) -> None:
    """The UI redirects to its login page without a session cookie."""
    with httpx.Client(base_url=secured.url) as anonymous:
        r = anonymous.get("/ui/")
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login"


def test_ui_login_with_the_token_opens_a_session(secured: Server) -> None:
    """Posting the token (with the form's CSRF value) sets a session that opens the UI."""
    with httpx.Client(base_url=secured.url) as browser:
        page = browser.get("/ui/login")
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        bad = browser.post("/ui/login", data={"csrf": csrf, "token": "nope"})
        assert bad.status_code == 401
        r = browser.post("/ui/login", data={"csrf": csrf, "token": secured.token})
        assert r.status_code == 303
        assert browser.get("/ui/").status_code == 200


def test_ui_login_without_csrf_is_refused(secured: Server) -> None:
    """A login form posted from elsewhere (no CSRF cookie/field pair) is 403."""
    with httpx.Client(base_url=secured.url) as other_site:
        r = other_site.post("/ui/login", data={"token": secured.token})
    assert r.status_code == 403


def test_token_never_appears_in_the_log(tmp_path: Path) -> None:
    """After authenticated and refused calls, the host's output does not contain the token."""
    token = "canary-token-7f3a9c"
    server = launch(tmp_path, token=token)
    server.client.post("/v1/workflows/quick/runs", json={"input": {}})
    with httpx.Client(base_url=server.url) as anonymous:
        anonymous.get("/v1/runs", headers={"Authorization": f"Bearer {token}x"})
    out = stop(server)
    assert "GET /v1/runs" in out  # the access log is there...
    assert token not in out  # ...but not the token
