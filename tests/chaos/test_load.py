"""Load: 500 concurrent clients start and read runs on a real host process for a bounded time;
no errors, p50/p99 reported, the host's memory flat.

The host is ``python -m timebound serve`` on SQLite and loopback (tests/host's launcher), in its
own process. The clients are one asyncio process of raw HTTP/1.1 keep-alive connections
(tests/host/loadgen.py), each looping start → read. TB_LOAD_CLIENTS and TB_LOAD_SECONDS change
the size (defaults: 500 clients, for 15 s).
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time
from pathlib import Path

import pytest
from bench._common import percentile

from tests.host.conftest import launch, stop
from tests.host.loadgen import Load, run_load, start_and_read

CLIENTS = int(os.environ.get("TB_LOAD_CLIENTS", "500"))
SECONDS = float(os.environ.get("TB_LOAD_SECONDS", "15"))
# How long one request may take before it counts as an error. Client and host share the
# machine's cores, so under a full machine a request can wait seconds in the host's queue (at
# most one request per client is queued: the load is a closed loop); past this, it is a timeout.
REQUEST_TIMEOUT_S = 30.0
# Memory: the median RSS of the run's last third may exceed that of its middle third by at most
# this fraction. The first third is left out: it holds the warm-up (500 connections accepted,
# SQLite's page caches and Python's allocator arenas filling up: some 42 → 54 MiB here), after
# which a host that frees what each request used stays level. Measured on this suite's host:
# without a leak the middle-to-last growth was 0.2 to 1.1% (the tail of the warm-up reaching into
# the middle third); with a deliberate leak of 1 KiB per start it was 3.5% (some 1,300 starts per
# third). 2.5% sits between the two: a leak of a kilobyte per run started fails, the noise does
# not. The median ignores the odd sample taken during a garbage collection.
RSS_GROWTH = 0.025
SAMPLE_S = 0.1

pytestmark = pytest.mark.timeout(60 + int(SECONDS) + int(REQUEST_TIMEOUT_S))


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


async def _load_and_sample(url: str, pid: int, samples: list[int]) -> Load:
    """Run the clients; sample the host's RSS all along, on the same loop."""

    async def sample() -> None:
        while True:
            samples.append(_rss(pid))
            await asyncio.sleep(SAMPLE_S)

    sampler = asyncio.create_task(sample())
    try:
        script = functools.partial(start_and_read, definition="quick")
        return await run_load(url, CLIENTS, SECONDS, script, timeout=REQUEST_TIMEOUT_S)
    finally:
        sampler.cancel()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_host_holds_500_concurrent_clients_with_flat_memory(tmp_path: Path) -> None:
    """500 clients starting and reading runs get no error (no reset, no timeout, nothing but
    201 and 200) and the host's RSS stays level once warm."""
    server = launch(tmp_path)
    samples: list[int] = []
    started = time.monotonic()
    try:
        load = asyncio.run(_load_and_sample(server.url, server.proc.pid, samples))
    finally:
        log = stop(server)
    elapsed = time.monotonic() - started
    lat = load.latencies
    third = len(samples) // 3
    middle = statistics.median(samples[third : 2 * third])
    last = statistics.median(samples[2 * third :])
    print(
        f"\nload: {CLIENTS} clients for {elapsed:.1f} s: {load.requests} requests "
        f"({load.requests / elapsed:.0f}/s), p50 {percentile(lat, 50) * 1000:.0f} ms, "
        f"p99 {percentile(lat, 99) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms; "
        f"host RSS median middle third {middle / 2**20:.1f} MiB, last third {last / 2**20:.1f} MiB"
    )
    assert load.errors == [], load.errors[:10]
    assert set(load.statuses) == {200, 201}, load.statuses
    assert load.statuses[201] == load.statuses[200]  # every run started was read back
    assert load.statuses[201] >= CLIENTS, "fewer runs than clients: the load proves nothing"
    assert "Traceback" not in log
    assert third >= 10, f"only {len(samples)} RSS samples"
    assert last <= middle * (1 + RSS_GROWTH), [s // 1024 for s in samples]
