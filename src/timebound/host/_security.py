"""What the host checks of a browser's request before any route sees it (D8.4, D8.5, D8.9).

- **Host allow-list (D8.5).** A page on ``http://evil.example:8080`` whose name is rebound to
  127.0.0.1 reaches a loopback host with its own origin, so the browser lets the page read the
  answers; the only trace is the ``Host`` header, which still says ``evil.example``. The host
  answers a name only if it is a loopback name (``localhost``, ``*.localhost``), an IP address (no
  name to rebind), or configured (``--allowed-host``).
- **Same origin for what changes state (D8.4).** ``Sec-Fetch-Site`` must be ``same-origin`` (or
  ``none``: typed by the user) and ``Origin`` must name this host. Another port of the same
  machine is *same-site* but not same-origin, and its cookies reach this host, so SameSite alone
  does not stop it. Clients that send neither header (curl, programs) are not browsers, and the
  form's CSRF token and the API's Bearer token still apply.
- **Cookies under TLS (D8.9).** Served over https (TLS, or a trusted proxy's
  ``X-Forwarded-Proto``), the session cookie is ``__Host-tb_session`` with ``Secure``: a browser
  takes that name only from a secure origin, for this exact host, so nothing on plain http or a
  sibling subdomain can plant or overwrite it.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["cross_site", "host_allowed", "session_cookie_name"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split_authority(authority: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6]:port`` for IPv6) → (lower-case host, port or None)."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        name, rest = authority[1:end], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        name, _, port_text = authority.partition(":")
    if port_text:
        if not port_text.isdigit() or int(port_text) > 65535:
            return None
        return name.lower().rstrip("."), int(port_text)
    return name.lower().rstrip("."), None


def host_allowed(header: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether the ``Host`` header names this host (D8.5)."""
    if not header:
        return False
    split = _split_authority(header.strip())
    if split is None or not split[0]:
        return False
    name = split[0]
    if name == "localhost" or name.endswith(".localhost") or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def cross_site(request: Request) -> str | None:
    """Why a browser request did not come from one of this host's own pages, or None (D8.4)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return (
            f"a {site} request may not act here (Sec-Fetch-Site: {site}); "
            "use the host's own pages or an API client"
        )
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if not _same_origin(origin, request):
        return f"the request comes from {origin!r}, not from this host's pages (Origin)"
    return None


def _same_origin(origin: str, request: Request) -> bool:
    parts = urlsplit(origin)
    if parts.scheme not in _DEFAULT_PORTS or parts.path or parts.query:
        return False  # "null" (a sandbox, a file, a redirect chain) and anything malformed
    mine = _split_authority(request.headers.get("host", ""))
    theirs = _split_authority(parts.netloc)
    if mine is None or theirs is None:
        return False
    default = _DEFAULT_PORTS[parts.scheme]
    # Behind a proxy that ends TLS the host may see http while the page was https; the other
    # way round (an http page acting on an https host) is a downgrade and refused.
    if request.url.scheme == "https" and parts.scheme != "https":
        return False
    return (mine[0], mine[1] or default) == (theirs[0], theirs[1] or default)


def session_cookie_name(request: Request) -> str:
    """``__Host-tb_session`` over https, ``tb_session`` over plain http (D8.9)."""
    return "__Host-tb_session" if request.url.scheme == "https" else "tb_session"
