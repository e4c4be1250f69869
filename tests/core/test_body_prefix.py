"""``read_prefix`` (D4.8, D4.14): the first ``limit`` bytes of a stream and whether they are all
of it; reading stops at the first chunk past the limit, the rest never pulled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from timebound._core._body import aread_prefix, read_prefix

CASES = [
    ([b"ab", b"cd"], 4, (b"abcd", True)),  # just at the limit: whole
    ([b"ab", b"cde"], 4, (b"abcd", False)),  # one byte past, within a chunk: cut there
    ([b"abcd", b"e"], 4, (b"abcd", False)),  # past it by a later chunk
    ([], 4, (b"", True)),
]


def _endless(pulled: list[int], chunks: list[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        pulled.append(len(chunk))
        yield chunk
    while True:  # a peer that never ends: the reader must stop by itself
        pulled.append(1)
        yield b"x"


@pytest.mark.parametrize(("chunks", "limit", "expected"), CASES)
def test_the_prefix_and_whether_it_is_whole(
    chunks: list[bytes], limit: int, expected: tuple[bytes, bool]
) -> None:
    """Just at the limit is whole; a byte past it is cut at the limit."""
    assert read_prefix(iter(chunks), limit) == expected

    async def chunked() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    assert asyncio.run(aread_prefix(chunked(), limit)) == expected


def test_an_endless_stream_is_read_no_further_than_the_first_chunk_past_the_limit() -> None:
    """An endless stream ends the read at the limit: one chunk past it pulled, no more."""
    pulled: list[int] = []
    assert read_prefix(_endless(pulled, [b"abc"]), 5) == (b"abcxx", False)
    assert sum(pulled) == 6
