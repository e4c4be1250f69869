"""Hostile peers in a real server process on loopback: a 2 GiB answer, no answer, a foreign href.

The host reads a connector's answer with a byte cap (D6.21) and follows only hrefs on the
connector's own origin (D7.12); either refusal fails the operation, never the process (D7.13).
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound.deferred import HostPolicy, HttpConnector, Poller, Registry
from timebound.deferred._poller import PollRefused

from ._hostile_server import hostile_server
from .conftest import operation_doc

pytestmark = pytest.mark.asyncio_real

MiB = 1024 * 1024


@pytest.fixture
def peer() -> Iterator[str]:
    """The hostile server's base URL."""
    with hostile_server() as url:
        yield url


@pytest.fixture
def bystander() -> Iterator[str]:
    """A second server on another origin, to see whether anything reached it."""
    with hostile_server() as url:
        yield url


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _Op:
    """The fields of an operation a connector reads."""

    def __init__(self, status_href: str | None, cancel_href: str | None = None) -> None:
        self.status_href = status_href
        self.cancel_href = cancel_href


async def test_a_2_gib_status_answer_is_refused_at_the_cap(peer: str) -> None:
    """A connector answering 2 GiB costs at most the cap in memory and fails as too-large."""
    connector = HttpConnector(peer, max_bytes=4 * MiB)
    before = _peak_rss_mib()
    with pytest.raises(PollRefused) as err:
        await connector.status(_Op("/huge"))  # type: ignore[arg-type]
    await connector.aclose()
    # Coarse: the cap is 4 MiB; reading the whole answer would take more than 2,000 MiB.
    assert _peak_rss_mib() - before < 200
    assert err.value.code == "too-large"
    assert "4194304 bytes" in str(err.value)


async def test_a_peer_that_never_answers_is_bounded_by_the_deadline(peer: str) -> None:
    """A status endpoint that never answers ends at the poll's deadline, not later."""
    connector = HttpConnector(peer)
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(0.3):
            await connector.status(_Op("/silent"))  # type: ignore[arg-type]
    await connector.aclose()


async def test_a_foreign_status_href_is_never_requested(peer: str, bystander: str) -> None:
    """An href on another origin fails as foreign-href; the other origin sees no request."""
    connector = HttpConnector(peer)
    for href in (f"{bystander}/steal", "//" + bystander.split("//")[1] + "/steal"):
        with pytest.raises(PollRefused) as err:
            await connector.status(_Op(href))  # type: ignore[arg-type]
        assert err.value.code == "foreign-href"
    with pytest.raises(PollRefused):
        await connector.cancel(_Op("/x", f"{bystander}/cancel"))  # type: ignore[arg-type]
    await connector.aclose()
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{bystander}/hits")).text == "0"


async def test_a_redirect_is_never_followed_even_by_a_client_that_would(
    peer: str, bystander: str
) -> None:
    """A status answered with a redirect fails as redirect-refused, also through a client
    made with ``follow_redirects=True``: a redirect must not carry a poll past the origin rule
    (D7.12). The redirect's target sees no request."""
    from timebound.propagation.httpx import AsyncDeadlineTransport

    client = httpx.AsyncClient(
        base_url=peer, follow_redirects=True, transport=AsyncDeadlineTransport()
    )
    connector = HttpConnector(peer, client)
    for target in (f"{bystander}/steal", f"{peer}/elsewhere"):
        with pytest.raises(PollRefused) as err:
            await connector.status(_Op(f"/redirect?{target}"))  # type: ignore[arg-type]
        assert err.value.code == "redirect-refused"
        assert "302" in str(err.value) and target in str(err.value)
    await client.aclose()
    async with httpx.AsyncClient() as plain:
        assert (await plain.get(f"{bystander}/hits")).text == "0"


async def _settled(host: Registry, op_id: str) -> Any:
    for _ in range(1000):
        op = await host.get(op_id)
        if op is not None and op.terminal:
            return op
        await asyncio.sleep(0.01)
    raise AssertionError(f"{op_id} never ended")


async def test_the_poller_fails_an_operation_with_a_foreign_href(
    peer: str, bystander: str, store_url: str
) -> None:
    """Registered with a status_href on another origin, the operation fails (foreign-href)."""
    connector = HttpConnector(peer)
    doc = operation_doc(retry_after=1, status_href=f"{bystander}/status")
    async with Registry(store_url, policy=HostPolicy(jitter=False)) as host:
        await host.register(doc, module="svc")
        async with Poller(host, {"svc": connector}):
            op = await _settled(host, doc["operation/id"])
    await connector.aclose()
    assert (op.status, op.last_error_code) == ("failed", "foreign-href")
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{bystander}/hits")).text == "0"


async def test_the_poller_fails_an_operation_whose_answer_is_too_large(
    peer: str, store_url: str
) -> None:
    """A 2 GiB status answer fails the operation with too-large; the host goes on."""
    connector = HttpConnector(peer, max_bytes=MiB)
    doc = operation_doc(retry_after=1, status_href="/huge")
    before = _peak_rss_mib()
    async with Registry(store_url, policy=HostPolicy(jitter=False)) as host:
        await host.register(doc, module="svc")
        async with Poller(host, {"svc": connector}):
            op = await _settled(host, doc["operation/id"])
    await connector.aclose()
    assert (op.status, op.last_error_code) == ("failed", "too-large")
    assert _peak_rss_mib() - before < 200


async def test_a_status_answered_gone_or_unknown_ends_the_operation(peer: str) -> None:
    """410 (the owner no longer retains the operation) and 404 (it never knew it) are answers no
    later poll can change (D7.13): the poll is refused with its own code and the owner's detail,
    never taken as a status document to reject and poll again until the operation expires."""
    connector = HttpConnector(peer)
    with pytest.raises(PollRefused) as gone:
        await connector.status(_Op("/gone"))  # type: ignore[arg-type]
    with pytest.raises(PollRefused) as unknown:
        await connector.status(_Op("/nowhere"))  # type: ignore[arg-type]
    await connector.aclose()
    assert gone.value.code == "remote-gone"
    assert "410" in str(gone.value) and "no longer retained" in str(gone.value)
    assert unknown.value.code == "remote-unknown" and "404" in str(unknown.value)


async def test_another_client_error_is_a_transient_poll_failure(peer: str) -> None:
    """A 403 may be a credential being rotated: the poll backs off and tries again, with the
    status in its code, until the operation's own expiry."""
    from timebound.deferred import TransientPollError

    connector = HttpConnector(peer)
    with pytest.raises(TransientPollError) as err:
        await connector.status(_Op("/forbidden"))  # type: ignore[arg-type]
    await connector.aclose()
    assert err.value.code == "poll-http-403"
