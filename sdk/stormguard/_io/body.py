"""Response bodies read within a size cap, whatever their Content-Encoding.

httpx decodes ``gzip``/``deflate`` a network chunk at a time and in one piece:
64 KiB off the wire can inflate to 64 MiB at once, so a cap checked after
decoding is passed before it is checked (a gzip bomb), and a body of a billion
blank lines is parsed as one huge piece that no deadline check interrupts.
So the body is read raw (``iter_raw``) and decoded here with zlib's
``max_length``: never more than ``PIECE_BYTES`` of output per step. Each piece
is counted against the cap (``BodyLimit``) and the caller checks its deadline
between pieces. Hand-written because no library bounds the output of one
decoding step; it is zlib's own ``decompressobj``, driven in small steps.

Only the codings the client asks for (``ACCEPT_ENCODING``) are decoded;
others pass through undecoded, as httpx does with codings it cannot decode.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator

from .._core.http import httpx, library_of
from ..protocol import parse_non_negative_int

__all__ = [
    "ACCEPT_ENCODING",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "PIECE_BYTES",
    "BodyLimit",
    "BodyTooLargeError",
    "BoundedDecoder",
    "aiter_body",
    "decoded_headers",
    "iter_body",
    "read_response",
]

#: Default cap on one response body, and on the decoded bytes of one stream: an
#: LLM stream of 100k tokens is about 20 MB.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: The most one decoding step yields (and the size of the pieces an identity body
#: is cut into), so the work between two deadline checks stays small.
PIECE_BYTES = 1 << 16
#: What the client accepts: the codings decoded here, in bounded steps.
ACCEPT_ENCODING = "gzip, deflate"


class BodyTooLargeError(ValueError):
    """A body grew past its cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"The response body exceeds max_response_bytes={limit}")
        self.limit = limit


class BodyLimit:
    """Counts the decoded bytes of one body (or one stream) against a cap.

    A declared ``content-length`` over the cap fails before any byte is read.
    """

    __slots__ = ("limit", "size")

    def __init__(self, limit: int, response: httpx.Response | None = None) -> None:
        self.limit = limit
        self.size = 0
        if response is not None:
            declared = parse_non_negative_int(response.headers.get("content-length"))
            if declared is not None and declared > limit:
                raise BodyTooLargeError(limit)

    def add(self, size: int) -> None:
        self.size += size
        if self.size > self.limit:
            raise BodyTooLargeError(self.limit)


class _Inflater:
    """One zlib coding (gzip or deflate), decoded at most ``PIECE_BYTES`` per step."""

    __slots__ = ("_decompressor", "_first", "_raw_fallback")

    def __init__(self, coding: str) -> None:
        gzip = coding == "gzip"
        self._decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        # Some servers send raw deflate (no zlib header) as "deflate": httpx retries
        # the first chunk that way, and so does this.
        self._raw_fallback = not gzip
        self._first = True

    def decode(self, data: bytes) -> Iterator[bytes]:
        first, self._first = self._first, False
        decompressor = self._decompressor
        while data and not decompressor.eof:
            try:
                out = decompressor.decompress(data, PIECE_BYTES)
            except zlib.error as exc:
                if first and self._raw_fallback:
                    self._decompressor = decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
                    first = False
                    continue
                raise httpx.DecodingError(str(exc)) from exc
            first = False
            data = decompressor.unconsumed_tail
            if out:
                yield out

    def flush(self) -> Iterator[bytes]:
        try:
            out = self._decompressor.flush()
        except zlib.error as exc:  # pragma: no cover (flush after a full drain)
            raise httpx.DecodingError(str(exc)) from exc
        yield from _cut(out)


def _cut(data: bytes) -> Iterator[bytes]:
    if len(data) <= PIECE_BYTES:
        if data:
            yield data
        return
    for at in range(0, len(data), PIECE_BYTES):
        yield data[at : at + PIECE_BYTES]


class BoundedDecoder:
    """Decodes a body's Content-Encoding (a chain of them, in order) into pieces of
    at most ``PIECE_BYTES``, lazily: nothing is inflated before it is asked for."""

    __slots__ = ("_stages",)

    def __init__(self, content_encoding: list[str]) -> None:
        # Applied in the order listed, so undone from the last to the first.
        codings = [c.strip().lower() for c in content_encoding]
        self._stages = [_Inflater(c) for c in reversed(codings) if c in ("gzip", "deflate")]

    @property
    def is_identity(self) -> bool:
        """Whether no coding is decoded: pieces are only cut to ``PIECE_BYTES``."""
        return not self._stages

    @classmethod
    def for_response(cls, response: httpx.Response) -> BoundedDecoder:
        return cls(response.headers.get_list("content-encoding", split_commas=True))

    def decode(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, data)

    def flush(self) -> Iterator[bytes]:
        for index, stage in enumerate(self._stages):
            for piece in stage.flush():
                yield from self._through(index + 1, piece)

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._stages):
            yield from _cut(data)
            return
        for piece in self._stages[index].decode(data):
            yield from self._through(index + 1, piece)


def iter_body(response: httpx.Response) -> Iterator[bytes]:
    """The decoded body of a streamed response, in pieces of at most ``PIECE_BYTES``."""
    if response.is_stream_consumed:  # read already (a transport that built it in memory)
        yield from _cut(response.content)
        return
    decoder = BoundedDecoder.for_response(response)
    if decoder.is_identity:  # most streams: no generator per piece to decode nothing
        for raw in response.iter_raw():
            if len(raw) > PIECE_BYTES:
                yield from _cut(raw)
            elif raw:
                yield raw
        return
    for raw in response.iter_raw():
        yield from decoder.decode(raw)
    yield from decoder.flush()


async def aiter_body(response: httpx.Response) -> AsyncIterator[bytes]:
    """The async twin of :func:`iter_body`."""
    if response.is_stream_consumed:
        for piece in _cut(response.content):
            yield piece
        return
    decoder = BoundedDecoder.for_response(response)
    if decoder.is_identity:
        async for raw in response.aiter_raw():
            if len(raw) > PIECE_BYTES:
                for piece in _cut(raw):
                    yield piece
            elif raw:
                yield raw
        return
    async for raw in response.aiter_raw():
        for piece in decoder.decode(raw):
            yield piece
    for piece in decoder.flush():
        yield piece


def decoded_headers(response: httpx.Response) -> list[tuple[str, str]]:
    """``response``'s headers for a copy of it whose body is decoded: less those that
    describe the encoded bytes (their encoding, their length, their framing)."""
    return [
        (k, v)
        for k, v in response.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]


def read_response(
    response: httpx.Response, body: bytes, request: httpx.Request | None = None
) -> httpx.Response:
    """A response whose (decoded) body has been read, rebuilt for code that wants a
    plain one: the body, and headers that no longer claim an encoding or a length
    of the original bytes. Built by the library of ``request`` (default: the
    response's own), so an httpx2 caller gets an httpx2 response whatever library
    carried it."""
    if request is None:
        request = response.request
    headers = decoded_headers(response)
    response_type: type[httpx.Response] = library_of(request).Response
    return response_type(
        response.status_code,
        headers=headers,
        content=body,
        request=request,
        extensions={"http_version": response.extensions.get("http_version", b"HTTP/1.1")},
    )
