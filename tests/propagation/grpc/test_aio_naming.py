"""``aio_client_interceptors()`` is named for what it returns (a list, one interceptor per call
kind); the old name ``aio_client_interceptor()`` still works and warns. Real grpc.aio."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation.grpc import aio_client_interceptor, aio_client_interceptors

from .test_aio import start

pytestmark = pytest.mark.asyncio_real


async def _clamped_timeout_seen(interceptors: list[Any]) -> float | None:
    """Call a real server under a 5 s inherited deadline; the ``time_remaining()`` it saw."""
    seen: list[float | None] = []

    async def handler(request: bytes, context: Any) -> bytes:
        seen.append(context.time_remaining())
        return b""

    server, port = await start({"Call": grpc.unary_unary_rpc_method_handler(handler)})
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=interceptors
        ) as channel:
            with tb.inherit_deadline(tb.Deadline.after(5.0)):
                await channel.unary_unary("/test.Svc/Call")(b"", timeout=60.0)
    finally:
        await server.stop(None)
    return seen[0]


async def test_new_name_returns_one_interceptor_per_call_kind() -> None:
    """``aio_client_interceptors()`` is a list grpc.aio accepts, and it clamps the call."""
    interceptors = aio_client_interceptors()
    assert isinstance(interceptors, list) and len(interceptors) == 4
    left = await _clamped_timeout_seen([*interceptors])
    assert left is not None and left <= 5.1


def test_old_name_warns_and_returns_the_same_list() -> None:
    """``aio_client_interceptor()`` warns that it is deprecated and names its replacement."""
    with pytest.warns(DeprecationWarning, match=r"aio_client_interceptors\(\)"):
        interceptors = aio_client_interceptor()
    assert [type(i) for i in interceptors] == [type(i) for i in aio_client_interceptors()]


async def test_old_name_still_clamps_calls() -> None:
    """Code that still passes ``interceptors=aio_client_interceptor()`` keeps working."""
    with pytest.warns(DeprecationWarning):
        interceptors = aio_client_interceptor()
    left = await _clamped_timeout_seen(interceptors)
    assert left is not None and left <= 5.1
