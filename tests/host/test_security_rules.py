"""The Host allow-list and the same-origin rule as pure functions (D8.4, D8.5): edge cases of
the headers' syntax that the process tests do not spell out."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from timebound.host._security import cross_site, host_allowed

ALLOWED = ("ops.example.com",)


@pytest.mark.parametrize(
    ("header", "answered"),
    [
        ("localhost", True),
        ("LOCALHOST:8080", True),
        ("app.localhost:1", True),
        ("127.0.0.1:8080", True),
        ("[::1]:8080", True),
        ("[::1]", True),
        ("192.0.2.1", True),
        ("ops.example.com", True),
        ("ops.example.com.:443", True),
        ("evil.ops.example.com", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("", False),
        (None, False),
        (":8080", False),
        ("[::1", False),
        ("[::1]x", False),
        ("127.0.0.1:99999", False),
        ("127.0.0.1:80:80", False),
        ("::1", False),
    ],
)
def test_which_host_headers_are_answered(header: str | None, answered: bool) -> None:
    """Loopback names, IP addresses and configured names; nothing malformed or merely similar."""
    assert host_allowed(header, ALLOWED) is answered


def _request(host: str, scheme: str = "http", **headers: str) -> Request:
    raw = [(b"host", host.encode())]
    raw += [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    return Request(
        {"type": "http", "scheme": scheme, "headers": raw, "path": "/", "query_string": b""}
    )


@pytest.mark.parametrize(
    ("host", "scheme", "origin", "same"),
    [
        ("127.0.0.1:8080", "http", "http://127.0.0.1:8080", True),
        ("ops.example.com", "http", "https://ops.example.com", True),  # TLS ended at a proxy
        ("ops.example.com", "https", "https://ops.example.com:443", True),
        ("ops.example.com", "https", "http://ops.example.com", False),  # a downgrade
        ("127.0.0.1:8080", "http", "http://127.0.0.1:8081", False),
        ("127.0.0.1:8080", "http", "http://localhost:8080", False),
        ("127.0.0.1:8080", "http", "null", False),
        ("127.0.0.1:8080", "http", "http://127.0.0.1:8080/path", False),
        ("127.0.0.1:8080", "http", "file://", False),
    ],
)
def test_the_origin_must_be_this_host(host: str, scheme: str, origin: str, same: bool) -> None:
    """Origin is compared by host and port (default ports filled in); an http page acting on
    an https host, "null" and anything that is not an origin are other origins."""
    assert (cross_site(_request(host, scheme, origin=origin)) is None) is same


@pytest.mark.parametrize(
    ("site", "same"),
    [("same-origin", True), ("none", True), ("same-site", False), ("cross-site", False)],
)
def test_sec_fetch_site_must_be_same_origin(site: str, same: bool) -> None:
    """same-site (another port, a sibling subdomain) is not enough."""
    assert (cross_site(_request("127.0.0.1:8080", sec_fetch_site=site)) is None) is same


def test_a_request_without_browser_headers_passes() -> None:
    """No Origin and no Sec-Fetch-Site: not a browser, left to the tokens."""
    assert cross_site(_request("127.0.0.1:8080")) is None
