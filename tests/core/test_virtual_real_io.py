"""VirtualClock and real I/O: autojump never leaps past an answer a real peer is sending."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import trio

from timebound._core import _clock
from timebound.testing import VirtualClock


def _answer_later(sock: socket.socket, delay: float) -> threading.Thread:
    """A peer that answers after ``delay`` real seconds (a slow server on a loaded machine)."""

    def send() -> None:
        time.sleep(delay)
        sock.sendall(b"x")

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_asyncio_waits_for_real_io_instead_of_jumping_to_a_far_timer() -> None:
    """Inside real_io() the answer arrives at virtual 0; the 300 s timer fires after it, on time."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    seen: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(300, lambda: seen.append(("timer", _clock.now())))
        thread = _answer_later(peer, 0.2)
        try:
            with _clock.real_io():
                await loop.sock_recv(ours, 1)
                seen.append(("answer", _clock.now()))
        finally:
            thread.join()
        await asyncio.sleep(400)

    clock = VirtualClock()
    try:
        clock.run(main())
    finally:
        ours.close()
        peer.close()
    assert seen == [("answer", 0.0), ("timer", 300.0)]


def test_without_real_io_the_same_wait_lets_time_jump() -> None:
    """Outside real_io() an idle loop is idle: time leaps to the far timer before the answer."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    seen: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(300, lambda: seen.append(("timer", _clock.now())))
        thread = _answer_later(peer, 0.2)
        try:
            await loop.sock_recv(ours, 1)
            seen.append(("answer", _clock.now()))
        finally:
            thread.join()

    clock = VirtualClock()
    try:
        clock.run(main())
    finally:
        ours.close()
        peer.close()
    assert seen == [("timer", 300.0), ("answer", 300.0)]


def test_trio_waits_for_real_io_instead_of_jumping() -> None:
    """trio's virtual clock holds time too while real_io() is open."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    seen: list[tuple[str, float]] = []

    async def main() -> None:
        async def far_timer() -> None:
            await trio.sleep(300)
            seen.append(("timer", trio.current_time()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(far_timer)
            thread = _answer_later(peer, 0.2)
            sock = trio.socket.from_stdlib_socket(ours)
            try:
                with _clock.real_io():
                    await sock.recv(1)
                    seen.append(("answer", trio.current_time()))
            finally:
                thread.join()

    clock = VirtualClock()
    try:
        with clock:
            trio.run(main, clock=clock.trio_clock())
    finally:
        ours.close()
        peer.close()
    assert seen == [("answer", 0.0), ("timer", 300.0)]


def test_real_io_is_a_no_op_on_the_real_clock() -> None:
    """Without a virtual clock, ``_clock.real_io()`` is an empty context manager."""
    with _clock.real_io():
        pass
    clock = VirtualClock()
    with clock:
        assert _clock.real_io is not None and clock._io == 0
        with _clock.real_io():
            assert clock._io == 1
        assert clock._io == 0
