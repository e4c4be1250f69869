"""The host's listening socket: accepted connections send small answers at once."""

from __future__ import annotations

import asyncio
import socket

from timebound.host import load_config
from timebound.host._serve import listening_socket


def test_accepted_connections_have_nodelay() -> None:
    """asyncio turns TCP_NODELAY on for connections accepted on the host's socket (it does so
    only for sockets that name TCP as their protocol); without it a small answer's body waits
    for the client's delayed ACK behind its headers."""
    sock = listening_socket(load_config({"host": "127.0.0.1", "port": "0"}, {}, None))
    seen: list[int] = []

    async def main() -> None:
        accepted = asyncio.Event()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("socket")
            seen.append(peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            accepted.set()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            await asyncio.wait_for(accepted.wait(), 10)
            writer.close()
            await writer.wait_closed()

    asyncio.run(main())
    assert sock.proto == socket.IPPROTO_TCP
    assert seen and seen[0] != 0, seen


def test_the_socket_listens_before_the_address_is_printed() -> None:
    """``serve`` prints "listening on" before uvicorn starts accepting: a client connecting at
    once must be queued, not refused (a race a busy machine made visible)."""
    sock = listening_socket(load_config({"host": "127.0.0.1", "port": "0"}, {}, None))
    try:
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            pass  # accepted into the backlog: no server has run
    finally:
        sock.close()
