"""The operator UI's sessions (D8.7) and the CSRF tokens bound to them (D8.4).

A session is a random id in a cookie; the host keeps the signed-in ones in memory with their
instants (a restart signs operators out), so signing out ends a session for good and an idle or
old one expires. Every browser also gets such an id before it signs in (and on a host without a
token, where nobody signs in): it is stored nowhere, but it is what the page's CSRF token is bound
to. The token is an HMAC of the id under a key that never leaves this process, so a page that can
set cookies for this host (another port of the same machine, a sibling subdomain: "cookie
tossing") still cannot make a token that matches a cookie it chose.

Sign-in attempts are rate-limited per client address (a token bucket each, at most
``_MAX_ADDRESSES`` addresses remembered); a successful one gives its attempt back.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from .._core import _clock
from ..policies import TokenBucket

__all__ = ["LoginThrottle", "Sessions", "retry_after"]

# D8.7: a session ends after an hour without a request, and 12 hours after sign-in at the latest.
IDLE_S = 3600.0
MAX_AGE_S = 12 * 3600.0
# Sign-in attempts per client address: a burst of 5, then one every 12 seconds.
LOGIN_ATTEMPTS, LOGIN_PER_S = 5, 60.0
_MAX_ADDRESSES = 10_000
# What a session id this host made looks like (``token_urlsafe(32)``); anything else is replaced.
_ID = re.compile(r"[A-Za-z0-9_-]{43}")


@dataclass
class _Session:
    opened: float
    seen: float


class LoginThrottle:
    """How long a client address must wait before its next sign-in attempt (0: none)."""

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def wait_s(self, address: str) -> float:
        """Take an attempt for ``address`` if it has one; else the seconds until it has."""
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = self._buckets[address] = TokenBucket(LOGIN_ATTEMPTS, LOGIN_PER_S)
            # The oldest address goes first: a full bucket is the same as none.
            while len(self._buckets) > _MAX_ADDRESSES:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(address)
        wait = bucket.reserve()
        if wait > 0:
            bucket.refund()  # a refused attempt costs nothing more
        return wait

    def succeeded(self, address: str) -> None:
        """A sign-in with the right token gives its attempt back: only failures use them up."""
        bucket = self._buckets.get(address)
        if bucket is not None:
            bucket.refund()


class Sessions:
    """The signed-in sessions of one host, the CSRF key, and the sign-in throttle."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._live: dict[str, _Session] = {}
        self.throttle = LoginThrottle()

    @staticmethod
    def well_formed(session_id: str | None) -> bool:
        return session_id is not None and _ID.fullmatch(session_id) is not None

    @staticmethod
    def new_id() -> str:
        """A fresh id: for a browser that has none yet, and at every sign-in (never reused, so a
        session id planted before sign-in is worth nothing after it)."""
        return secrets.token_urlsafe(32)

    def open(self) -> str:
        """Sign a browser in: a new session id, live from now."""
        now = _clock.now()
        for stale in [sid for sid, s in self._live.items() if not self._fresh(s, now)]:
            del self._live[stale]
        session_id = self.new_id()
        self._live[session_id] = _Session(opened=now, seen=now)
        return session_id

    def _fresh(self, session: _Session, now: float) -> bool:
        return now - session.seen < IDLE_S and now - session.opened < MAX_AGE_S

    def valid(self, session_id: str | None) -> bool:
        """Whether ``session_id`` is signed in; a valid one's idle time starts again."""
        if session_id is None:
            return False
        session = self._live.get(session_id)
        if session is None:
            return False
        now = _clock.now()
        if not self._fresh(session, now):
            del self._live[session_id]
            return False
        session.seen = now
        return True

    def close(self, session_id: str | None) -> None:
        """Sign out: the id is no longer a session, whoever holds it."""
        if session_id is not None:
            self._live.pop(session_id, None)

    def csrf(self, session_id: str) -> str:
        """The CSRF token of forms shown to the holder of ``session_id`` (D8.4)."""
        mac = hmac.new(self._key, b"csrf:" + session_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def csrf_ok(self, session_id: str | None, presented: object) -> bool:
        if not self.well_formed(session_id) or not isinstance(presented, str):
            return False
        assert session_id is not None
        return hmac.compare_digest(presented.encode(), self.csrf(session_id).encode())


def retry_after(wait_s: float) -> str:
    """A ``Retry-After`` value in whole seconds, never shorter than the wait."""
    return str(max(1, math.ceil(wait_s)))
