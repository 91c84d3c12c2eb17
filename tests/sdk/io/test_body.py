"""Bodies read within a cap: bounded decoding of gzip/deflate, the cap, the rebuilt response."""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard._io.body import (
    PIECE_BYTES,
    BodyLimit,
    BodyTooLargeError,
    BoundedDecoder,
    aiter_body,
    iter_body,
    read_response,
)


def deflate(data: bytes, wbits: int = zlib.MAX_WBITS) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


def decode(coding: list[str], chunks: list[bytes]) -> list[bytes]:
    decoder = BoundedDecoder(coding)
    pieces = [piece for chunk in chunks for piece in decoder.decode(chunk)]
    return pieces + list(decoder.flush())


TEXT = b'{"id": "x", "choices": []}' * 1000


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        (["gzip"], gzip.compress(TEXT, mtime=0)),
        (["deflate"], deflate(TEXT)),
        (["deflate"], deflate(TEXT, -zlib.MAX_WBITS)),  # raw deflate, as some servers send it
        (["identity"], TEXT),
        ([], TEXT),
        (
            ["gzip", "deflate"],
            deflate(gzip.compress(TEXT, mtime=0)),
        ),  # applied in order, undone reversed
        (["br"], TEXT),  # not asked for, not decoded: passed on as httpx does
    ],
)
def test_each_coding_decodes_to_the_body(coding: list[str], encoded: bytes) -> None:
    assert b"".join(decode(coding, [encoded])) == TEXT


def test_a_bomb_comes_out_a_piece_at_a_time_and_only_as_far_as_it_is_read() -> None:
    bomb = gzip.compress(b"\n" * (8 << 20))  # 8 MiB of newlines, 8 KB compressed
    pieces = BoundedDecoder(["gzip"]).decode(bomb)
    first = [next(pieces) for _ in range(3)]
    assert [len(p) for p in first] == [PIECE_BYTES] * 3  # nothing more was inflated yet
    assert all(len(p) <= PIECE_BYTES for p in pieces)


def test_an_identity_chunk_is_cut_into_pieces() -> None:
    pieces = decode([], [b"x" * (PIECE_BYTES * 2 + 5)])
    assert [len(p) for p in pieces] == [PIECE_BYTES, PIECE_BYTES, 5]


@given(
    data=st.binary(max_size=5000).map(lambda b: b * 50),
    cuts=st.lists(st.integers(min_value=0, max_value=400_000), max_size=8),
    coding=st.sampled_from(["gzip", "deflate"]),
)
def test_decoding_does_not_depend_on_how_the_wire_cuts_the_body(
    data: bytes, cuts: list[int], coding: str
) -> None:
    encoded = gzip.compress(data) if coding == "gzip" else deflate(data)
    bounds = sorted({0, len(encoded), *(c % (len(encoded) + 1) for c in cuts)})
    chunks = [encoded[a:b] for a, b in itertools.pairwise(bounds)]
    pieces = decode([coding], chunks)
    assert b"".join(pieces) == data
    assert all(0 < len(p) <= PIECE_BYTES for p in pieces)


def test_a_corrupt_body_is_an_httpx_decoding_error() -> None:
    with pytest.raises(httpx.DecodingError):
        decode(["gzip"], [b"\x1f\x8b\x08\x00not gzip at all"])
    with pytest.raises(httpx.DecodingError):
        decode(["deflate"], [b"\xff" * 100])  # neither zlib-wrapped nor raw deflate


def test_the_limit_counts_decoded_bytes_and_trusts_a_declared_length_over_it() -> None:
    limit = BodyLimit(100)
    limit.add(60)
    limit.add(40)
    with pytest.raises(BodyTooLargeError, match="max_response_bytes=100"):
        limit.add(1)
    too_long = httpx.Response(200, headers={"content-length": "101"})
    with pytest.raises(BodyTooLargeError):
        BodyLimit(100, too_long)
    assert BodyLimit(100, httpx.Response(200, headers={"content-length": "100"})).size == 0


def gzip_response(body: bytes) -> httpx.Response:
    return httpx.Response(
        200,
        headers={"content-encoding": "gzip", "content-type": "application/json"},
        stream=httpx.ByteStream(gzip.compress(body)),
        request=httpx.Request("GET", "http://x/"),
    )


def test_iter_body_decodes_a_streamed_response_and_rebuilds_it_read() -> None:
    response = gzip_response(TEXT)
    body = b"".join(iter_body(response))
    assert body == TEXT
    rebuilt = read_response(response, body)
    assert "content-encoding" not in rebuilt.headers  # the body is decoded already
    assert rebuilt.content == TEXT
    assert rebuilt.headers["content-type"] == "application/json"


async def test_aiter_body_is_the_same_for_async_responses() -> None:
    response = httpx.Response(
        200,
        headers={"content-encoding": "deflate"},
        stream=_AsyncBytes(deflate(TEXT)),
        request=httpx.Request("GET", "http://x/"),
    )
    assert b"".join([piece async for piece in aiter_body(response)]) == TEXT


def test_a_response_read_already_is_cut_into_pieces_of_its_content() -> None:
    response = httpx.Response(200, content=b"y" * (PIECE_BYTES + 1))  # read on creation
    assert [len(p) for p in iter_body(response)] == [PIECE_BYTES, 1]


class _AsyncBytes(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self._data), 1000):
            yield self._data[at : at + 1000]


def test_a_declared_length_of_other_digits_is_no_length() -> None:
    """A ``content-length`` of ``¹`` (latin-1 0xb9: a digit to ``str.isdigit``, no number
    to ``int()``) is no declared length: the body is counted as it comes."""
    response = httpx.Response(200, headers=[(b"content-length", b"\xb9")])
    assert BodyLimit(10, response).size == 0
