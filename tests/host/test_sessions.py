"""UI sessions on virtual time (D8.7): idle and absolute expiry, the sign-in throttle's
recovery. The app runs in process; the clock is the test's, so an hour takes no time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from timebound.host import Host, create_app, load_config
from timebound.host._sessions import IDLE_S, LOGIN_ATTEMPTS, LOGIN_PER_S, MAX_AGE_S
from timebound.testing import VirtualClock

from .conftest import csrf_of

TOKEN = "session-test-token-0123456789"


def _client(tmp_path: Path) -> httpx.AsyncClient:
    config = load_config({"db": f"sqlite:///{tmp_path}/h.db"}, {"TIMEBOUND_TOKEN": TOKEN}, None)
    app = create_app(Host.build(config))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost")


async def _sign_in(browser: httpx.AsyncClient, token: str = TOKEN) -> httpx.Response:
    csrf = csrf_of((await browser.get("/ui/login")).text)
    return await browser.post("/ui/login", data={"csrf": csrf, "token": token})


async def _signed_in(browser: httpx.AsyncClient) -> bool:
    r = await browser.get("/ui/traces")  # a page that needs a session but not the store
    return r.status_code == 200


async def test_an_idle_session_expires_after_an_hour(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """A session used within the hour lives on; an hour without a request ends it."""
    async with _client(tmp_path) as browser:
        assert (await _sign_in(browser)).status_code == 303
        await asyncio.sleep(IDLE_S - 1)
        assert await _signed_in(browser)
        await asyncio.sleep(IDLE_S - 1)
        assert await _signed_in(browser)
        await asyncio.sleep(IDLE_S)
        assert not await _signed_in(browser)


async def test_a_busy_session_still_ends_after_twelve_hours(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """However often it is used, a session ends MAX_AGE_S after sign-in."""
    async with _client(tmp_path) as browser:
        await _sign_in(browser)
        start = virtual_clock.now()
        while virtual_clock.now() - start < MAX_AGE_S - 1:
            assert await _signed_in(browser)
            await asyncio.sleep(min(IDLE_S / 2, MAX_AGE_S - 1 - (virtual_clock.now() - start)))
        assert await _signed_in(browser)
        await asyncio.sleep(1)
        assert virtual_clock.now() - start == MAX_AGE_S
        assert not await _signed_in(browser)


async def test_the_throttle_lets_attempts_through_again_as_time_passes(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Past the burst, an attempt is a 429 whose Retry-After is when the next one is allowed;
    at that instant (not before) the next attempt is heard."""
    async with _client(tmp_path) as browser:
        for _ in range(LOGIN_ATTEMPTS):
            assert (await _sign_in(browser, "wrong-guess")).status_code == 401
        refused = await _sign_in(browser, TOKEN)
        assert refused.status_code == 429
        wait = int(refused.headers["retry-after"])
        assert wait == LOGIN_PER_S / LOGIN_ATTEMPTS
        await asyncio.sleep(wait - 1)
        assert (await _sign_in(browser, TOKEN)).status_code == 429
        await asyncio.sleep(1)
        assert (await _sign_in(browser, TOKEN)).status_code == 303


async def test_successful_sign_ins_use_up_no_attempts(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Signing in with the right token again and again is never throttled: only failures count."""
    async with _client(tmp_path) as browser:
        for _ in range(3 * LOGIN_ATTEMPTS):
            assert (await _sign_in(browser)).status_code == 303
        for _ in range(LOGIN_ATTEMPTS):
            assert (await _sign_in(browser, "wrong-guess")).status_code == 401
        assert (await _sign_in(browser)).status_code == 429
