"""openai-python's ``.with_streaming_response``: the final response, its body unread.

``client.chat.completions.with_streaming_response.create(...)`` is a context
manager whose ``APIResponse`` (``AsyncAPIResponse``) has not read the body: it
is read when asked, once (``read()``, ``text()``, ``json()``, ``iter_bytes()``,
``iter_text()``, ``iter_lines()``, ``parse()``), within ``max_response_bytes``
and the call's deadline, and the response is closed at the end of the block, so
the server sees the disconnect if the body was not read to its end.

The pipeline runs as for any call, and decides what becomes of the body
(``LogicalCall``: ``handed_over``, ``result_of_body``, ``failed_after_hand_over``,
``closed_after_hand_over``): the attempt succeeded at its headers, so nothing
is retried once the response is handed over, and an error reading the body is
the call's error. A ``stream=True`` call is read up to its first event first (a
failure before it is retried); ``iter_bytes()`` hands its bytes on from the
first, as they came, and ``parse()`` returns the ``Stream``. The sync and async
classes only read bytes; what they read is cut into chunks, text or lines by one
piece of code without I/O (``_Pieces``).
"""

from __future__ import annotations

import codecs
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, cast

import anyio

from ._body import aiter_body, iter_body
from ._exceptions import APIError, StormguardError
from ._http import http_errors, httpx
from ._pipeline import BodyReader, Delivery
from ._raw_response import _ResponseBase
from ._responses import translate_transport_error
from ._streaming import AsyncStream, Stream

__all__ = [
    "APIResponse",
    "AsyncAPIResponse",
    "AsyncResponseContextManager",
    "ResponseContextManager",
    "StreamAlreadyConsumed",
    "async_to_streamed_response_wrapper",
    "to_streamed_response_wrapper",
]

P = ParamSpec("P")
R = TypeVar("R")
_ResponseT = TypeVar("_ResponseT", bound="APIResponse[Any]")
_AsyncResponseT = TypeVar("_AsyncResponseT", bound="AsyncAPIResponse[Any]")


class StreamAlreadyConsumed(StormguardError):
    """The body was already handed out another way (``iter_bytes()`` then
    ``read()``, or ``parse()`` of a stream then ``iter_lines()``): read it once."""

    def __init__(self) -> None:
        super().__init__(
            "The response body was already consumed; read it once (call .read() first"
            " to keep the bytes, or keep what iter_bytes() yields)"
        )


class _Body:
    """The state of a handed-over body, shared by ``APIResponse`` and ``AsyncAPIResponse``:
    which way it is being read (once only), what was read, and the call's end."""

    __slots__ = ("body", "consumed", "delivery", "ended", "parsed", "whole")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.body: bytes | None = None
        self.parsed: Any = None
        self.consumed = False
        self.whole = False
        self.ended = False

    def take(self) -> None:
        """Start reading the body (raises if it was already read another way)."""
        if self.consumed:
            raise StreamAlreadyConsumed
        self.consumed = True

    def reader(self) -> BodyReader:
        try:
            return BodyReader(self.delivery.call, self.delivery.response)
        except APIError as exc:
            raise self.delivery.call.failed_after_hand_over(exc) from None

    def transport_failed(self, exc: Exception) -> APIError:
        call = self.delivery.call
        if isinstance(exc, TimeoutError):  # the cancel scope of the call's deadline
            error = call.deadline_error("while reading the response", response_started=True)
        else:
            error = translate_transport_error(
                exc, response_started=True, server_load=call.server_load
            )
        return call.failed_after_hand_over(error)

    def result(self, body: bytes) -> Any:
        if self.parsed is None:
            self.parsed = self.delivery.call.result_of_body(self.delivery.response, body)
        return self.parsed

    def text(self, body: bytes) -> str:
        return body.decode(self.delivery.response.encoding or "utf-8", errors="replace")

    def close(self) -> None:
        """The caller is done: the call ends (once) with what was read."""
        if not self.ended:
            self.ended = True
            read = self.body if self.body is not None else (b"" if self.whole else None)
            self.delivery.call.closed_after_hand_over(read)


class _Pieces:
    """Re-cuts decoded pieces into ``chunk_size`` bytes, text or lines (``iter_bytes``,
    ``iter_text``, ``iter_lines``), without I/O: the sync and async loops feed it."""

    def __init__(self, response: httpx.Response, chunk_size: int | None, mode: str) -> None:
        self._size = chunk_size
        self._mode = mode
        self._bytes = b""
        self._text = ""
        encoding = response.encoding or "utf-8"
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")

    def feed(self, piece: bytes) -> list[Any]:
        if self._mode == "bytes":
            if self._size is None:
                return [piece] if piece else []
            self._bytes += piece
            out = []
            while len(self._bytes) >= self._size:
                out.append(self._bytes[: self._size])
                self._bytes = self._bytes[self._size :]
            return out
        text = self._decoder.decode(piece)
        if self._mode == "text":
            return self._cut_text(text)
        self._text += text
        lines = self._text.splitlines(keepends=True)
        # The last line may go on in the next piece (and "\r" may be half of "\r\n").
        self._text = lines.pop() if lines and not lines[-1].endswith("\n") else ""
        return [line.rstrip("\r\n") for line in lines]

    def _cut_text(self, text: str) -> list[str]:
        if self._size is None:
            return [text] if text else []
        self._text += text
        out = []
        while len(self._text) >= self._size:
            out.append(self._text[: self._size])
            self._text = self._text[self._size :]
        return out

    def flush(self) -> list[Any]:
        if self._mode == "bytes":
            return [self._bytes] if self._bytes else []
        rest = self._text + self._decoder.decode(b"", final=True)
        if self._mode == "lines":
            return [line.rstrip("\r\n") for line in rest.splitlines(keepends=True)]
        return [rest] if rest else []


class APIResponse(_ResponseBase[R]):
    """What ``.with_streaming_response`` yields (sync): the body is read when asked,
    once, and the response closed at the end of the ``with`` block."""

    def __init__(self, delivery: Delivery) -> None:
        super().__init__(delivery)
        self._body = _Body(delivery)

    def _stream(self) -> Stream[Any] | None:
        result = self._delivery.result
        return result if isinstance(result, Stream) else None

    def parse(self) -> R:
        """The result, its body read now; a ``stream=True`` call's ``Stream``."""
        stream = self._stream()
        if stream is not None:
            if self._body.parsed is None:
                self._body.take()
                self._body.parsed = stream
            return cast(R, stream)
        return cast(R, self._body.result(self.read()))

    def read(self) -> bytes:
        """The whole body (within ``max_response_bytes`` and the call's deadline)."""
        if self._body.body is None:
            self._body.body = b"".join(self._pieces())
        return self._body.body

    def text(self) -> str:
        return self._body.text(self.read())

    def json(self) -> object:
        return json.loads(self.read())

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """The decoded body as it arrives (a stream's from its first byte)."""
        return self._cut(chunk_size, "bytes")

    def iter_text(self, chunk_size: int | None = None) -> Iterator[str]:
        return self._cut(chunk_size, "text")

    def iter_lines(self) -> Iterator[str]:
        return self._cut(None, "lines")

    def _cut(self, chunk_size: int | None, mode: str) -> Iterator[Any]:
        if self._body.body is not None:
            source: Iterator[bytes] = iter((self._body.body,))
        else:
            source = self._pieces()
        pieces = _Pieces(self.http_response, chunk_size, mode)
        for piece in source:
            yield from pieces.feed(piece)
        yield from pieces.flush()

    def _pieces(self) -> Iterator[bytes]:
        self._body.take()
        stream = self._stream()
        if stream is not None:
            yield from _replay(stream)
            self._body.whole = True
            return
        reader = self._body.reader()
        response = self.http_response
        try:
            for piece in iter_body(response):
                reader.feed(piece)
                yield piece
        except http_errors() as exc:
            raise self._body.transport_failed(exc) from exc
        except APIError as exc:  # past the cap or the deadline
            raise self._delivery.call.failed_after_hand_over(exc) from None
        finally:
            response.close()
        self._body.whole = True

    def close(self) -> None:
        """Close the response; the server sees the disconnect if the body was not read."""
        stream = self._stream()
        if stream is not None:
            stream.close()
        else:
            self.http_response.close()
        self._body.close()


def _replay(stream: Stream[Any]) -> Iterator[bytes]:
    """A stream's bytes as they came: those read before its first event, then the rest
    (the stream's state still notes how it ends, as in transport mode)."""
    state = stream._state
    if state.done:  # the whole stream came before the hand-over
        state.passed_through()
    yield from state.raw_prefix
    try:
        for chunk in stream._bytes:
            state.passing_through(chunk)
            yield chunk
    except http_errors() as exc:
        raise state.transport_failed(exc) from exc
    state.passed_through()


class AsyncAPIResponse(_ResponseBase[R]):
    """The async twin of ``APIResponse``: ``await response.parse()``, ``async for line
    in response.iter_lines()``."""

    def __init__(self, delivery: Delivery) -> None:
        super().__init__(delivery)
        self._body = _Body(delivery)

    def _stream(self) -> AsyncStream[Any] | None:
        result = self._delivery.result
        return result if isinstance(result, AsyncStream) else None

    async def parse(self) -> R:
        """The result, its body read now; a ``stream=True`` call's ``AsyncStream``."""
        stream = self._stream()
        if stream is not None:
            if self._body.parsed is None:
                self._body.take()
                self._body.parsed = stream
            return cast(R, stream)
        return cast(R, self._body.result(await self.read()))

    async def read(self) -> bytes:
        """The whole body (within ``max_response_bytes`` and the call's deadline)."""
        if self._body.body is None:
            self._body.body = b"".join([piece async for piece in self._pieces()])
        return self._body.body

    async def text(self) -> str:
        return self._body.text(await self.read())

    async def json(self) -> object:
        return json.loads(await self.read())

    def iter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """The decoded body as it arrives (a stream's from its first byte)."""
        return self._cut(chunk_size, "bytes")

    def iter_text(self, chunk_size: int | None = None) -> AsyncIterator[str]:
        return self._cut(chunk_size, "text")

    def iter_lines(self) -> AsyncIterator[str]:
        return self._cut(None, "lines")

    async def _cut(self, chunk_size: int | None, mode: str) -> AsyncIterator[Any]:
        pieces = _Pieces(self.http_response, chunk_size, mode)
        if self._body.body is not None:
            for out in pieces.feed(self._body.body):
                yield out
        else:
            async for piece in self._pieces():
                for out in pieces.feed(piece):
                    yield out
        for out in pieces.flush():
            yield out

    async def _pieces(self) -> AsyncIterator[bytes]:
        self._body.take()
        stream = self._stream()
        if stream is not None:
            async for chunk in _areplay(stream):
                yield chunk
            self._body.whole = True
            return
        reader = self._body.reader()
        response, call = self.http_response, self._delivery.call
        body = aiter_body(response)
        try:
            while True:
                with anyio.fail_after(call.remaining_or_none()):
                    try:
                        piece = await body.__anext__()
                    except StopAsyncIteration:
                        break
                reader.feed(piece)
                yield piece
        except http_errors(TimeoutError) as exc:
            raise self._body.transport_failed(exc) from exc
        except APIError as exc:  # past the cap or the deadline
            raise call.failed_after_hand_over(exc) from None
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        self._body.whole = True

    async def close(self) -> None:
        """Close the response, even from a cancelled task."""
        stream = self._stream()
        if stream is not None:
            await stream.aclose()
        else:
            with anyio.CancelScope(shield=True):
                await self.http_response.aclose()
        self._body.close()


async def _areplay(stream: AsyncStream[Any]) -> AsyncIterator[bytes]:
    """The async twin of ``_replay``; each read ends by the call's deadline."""
    state = stream._state
    if state.done:
        state.passed_through()
    for chunk in state.raw_prefix:
        yield chunk
    pieces = stream._bytes
    try:
        while True:
            with anyio.fail_after(state.call.remaining_or_none()):
                try:
                    chunk = await pieces.__anext__()
                except StopAsyncIteration:
                    break
            state.passing_through(chunk)
            yield chunk
    except http_errors(TimeoutError) as exc:
        raise state.transport_failed(exc) from exc
    state.passed_through()


class ResponseContextManager(Generic[_ResponseT]):
    """Makes the call when entered; closes the response when left."""

    def __init__(self, request: Callable[[], _ResponseT]) -> None:
        self._request = request
        self._response: _ResponseT | None = None

    def __enter__(self) -> _ResponseT:
        self._response = self._request()
        return self._response

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._response is not None:
            self._response.close()


class AsyncResponseContextManager(Generic[_AsyncResponseT]):
    """The async twin of ``ResponseContextManager``."""

    def __init__(self, request: Awaitable[_AsyncResponseT]) -> None:
        self._request = request
        self._response: _AsyncResponseT | None = None

    async def __aenter__(self) -> _AsyncResponseT:
        self._response = await self._request
        return self._response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._response is not None:
            await self._response.close()


def to_streamed_response_wrapper(
    func: Callable[P, R],
) -> Callable[P, ResponseContextManager[APIResponse[R]]]:
    """``func`` (bound in "unread" hand-over mode) as a context manager of an
    ``APIResponse``: the call is made when the block is entered."""

    @functools.wraps(func)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> ResponseContextManager[APIResponse[R]]:
        def request() -> APIResponse[R]:
            return APIResponse(cast(Delivery, func(*args, **kwargs)))

        return ResponseContextManager(request)

    return wrapped


def async_to_streamed_response_wrapper(
    func: Callable[P, Awaitable[R]],
) -> Callable[P, AsyncResponseContextManager[AsyncAPIResponse[R]]]:
    """The async twin of ``to_streamed_response_wrapper``."""

    @functools.wraps(func)
    def wrapped(
        *args: P.args, **kwargs: P.kwargs
    ) -> AsyncResponseContextManager[AsyncAPIResponse[R]]:
        async def request() -> AsyncAPIResponse[R]:
            return AsyncAPIResponse(cast(Delivery, await func(*args, **kwargs)))

        return AsyncResponseContextManager(request())

    return wrapped
