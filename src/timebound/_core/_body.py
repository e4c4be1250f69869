"""The one size-limited body reader: bytes someone else sends, streamed with a cap (D6.21).

A request body, a connector's status document, an ``http_request`` answer: each is read chunk by
chunk and refused as soon as it passes its limit, so a peer answering 2 GiB costs at most the
limit in memory, whatever ``Content-Length`` claims. The cap is checked before a chunk is kept.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from ._errors import InvalidInput

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Disconnected",
    "TooLarge",
    "declared_too_large",
    "aread_prefix",
    "asgi_chunks",
    "read_capped",
    "read_prefix",
    "too_large",
]

#: The default cap on what timebound reads from a peer (D6.21): 4 MiB.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024


class TooLarge(InvalidInput):
    """A body passed its byte limit (``limit``); code ``too-large``."""

    code = "too-large"

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self), self.limit))


def _rebuild(message: str, limit: int) -> TooLarge:
    return TooLarge(message, limit=limit)


def too_large(limit: int, what: str) -> TooLarge:
    """The error for ``what`` passing ``limit`` bytes (also for a declared length past it)."""
    return TooLarge(f"{what} is larger than the limit of {limit} bytes", limit=limit)


def declared_too_large(content_length: str | None, limit: int, what: str) -> None:
    """Refuse at once a body whose ``Content-Length`` already says it is past ``limit``."""
    declared = (content_length or "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit, what)


async def read_capped(chunks: AsyncIterable[bytes], limit: int, *, what: str = "the body") -> bytes:
    """Every chunk of ``chunks`` joined, or :class:`TooLarge` once they pass ``limit`` bytes.

    Stops reading at the first chunk past the limit: the caller closes the stream (an httpx
    response, an ASGI request), so the rest is never received into memory.
    """
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > limit:
            raise too_large(limit, what)
        body += chunk
    return bytes(body)


def read_prefix(chunks: Iterable[bytes], limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``chunks`` and whether they are all of it (D4.8, D4.14).

    For a body that is not an error to receive whole but must not cost more than ``limit``: a
    peer's refusal, a failed answer. Reading stops at the first chunk past the limit, so at
    most ``limit`` bytes plus one chunk are ever held; the caller then closes the stream
    unread (its connection with it).
    """
    body = bytearray()
    for chunk in chunks:
        if len(body) + len(chunk) > limit:
            body += chunk[: limit - len(body)]
            return bytes(body), False
        body += chunk
    return bytes(body), True


async def aread_prefix(chunks: AsyncIterable[bytes], limit: int) -> tuple[bytes, bool]:
    """:func:`read_prefix` for an async stream."""
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > limit:
            body += chunk[: limit - len(body)]
            return bytes(body), False
        body += chunk
    return bytes(body), True


class Disconnected(Exception):
    """The client went away before its body was read to the end."""


async def asgi_chunks(receive: Callable[[], Awaitable[Any]]) -> AsyncIterator[bytes]:
    """The chunks of an ASGI request body (for :func:`read_capped`); :class:`Disconnected` if
    the client leaves first."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected("the client disconnected before sending its whole body")
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
