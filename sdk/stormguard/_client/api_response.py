"""``APIResponse`` and ``AsyncAPIResponse``: a response whose body is read when
asked, once, within ``max_response_bytes`` and the call's deadline; a
``stream=True`` call's bytes replayed from its first, as they came. One left open
(its block never left) is closed when it is collected, with a ``ResourceWarning``
(``_call/unclosed.py``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any, TypeVar, cast

import anyio

from .._call.call_result import Delivery, failed_after_hand_over
from .._call.stream_state import StreamState
from .._call.streaming import AsyncStream, Stream, _aclose, _close
from .._call.unclosed import aclose_later, close_later, warn_unclosed
from .._core.exceptions import APIError
from .._core.http import http_errors, httpx
from .._core.redact import display_url
from .._io.body import aiter_body, iter_body
from .._io.pool_life import running_loop
from .._io.read_within import anext_within
from .body_pieces import _Pieces
from .handed_over_body import _Body
from .raw_response import _ResponseBase

__all__ = ["APIResponse", "AsyncAPIResponse"]

R = TypeVar("R")


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
            raise failed_after_hand_over(self._delivery.call, exc) from None
        finally:
            response.close()
        self._body.whole = True

    def close(self) -> None:
        """Close the response; the server sees the disconnect if the body was not read."""
        response = self.http_response
        _close_response(_held(self._stream(), response)[0], response, self._body)

    def __del__(self) -> None:
        """Left open (a ``with`` block never left): closed by the reaper thread
        (``_call/unclosed.py``), with a warning."""
        body: _Body | None = getattr(self, "_body", None)
        if body is None or body.ended:
            return
        response = self.http_response
        state, held = _held(self._stream(), response)
        close_later(partial(_close_response, state, response, body))
        if held:
            warn_unclosed(self, _left(self, "response.close()"))


def _held(
    stream: Stream[Any] | AsyncStream[Any] | None, response: httpx.Response
) -> tuple[StreamState[Any] | None, bool]:
    """What a response left open holds: its stream's state, claimed now (None: no
    stream, or closed or claimed already), and whether it held anything (its stream,
    or an open response), which is what it warns of."""
    if stream is None:
        return None, not response.is_closed
    state = stream._claim()
    return state, state is not None


def _close_response(state: StreamState[Any] | None, response: httpx.Response, body: _Body) -> None:
    """Close a handed-over response (its stream's, if ``state``, claimed), then end the
    call with what was read."""
    try:
        if state is not None:
            _close(state)
        else:
            response.close()
    finally:
        body.close()


def _left(response: _ResponseBase[Any], close: str) -> str:
    """The warning of a response left open: which, and of which request."""
    try:
        request = response.http_request
        url = response._delivery.call.redactor.scrub(display_url(request.url))
        shown = f"{response!r} of {request.method} {url}"
    except Exception:  # Python shutting down: its name will do
        shown = type(response).__name__
    return (
        f"Unclosed {shown}: its connection is closed now, and its call ends with what was"
        f" read. Leave its with block, or call {close}"
    )


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
        #: The loop it is read on, which closes it if it is left open.
        self._loop = running_loop()

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
                try:
                    piece = await anext_within(body, call.remaining_or_none())
                except StopAsyncIteration:
                    break
                reader.feed(piece)
                yield piece
        except http_errors(TimeoutError) as exc:
            raise self._body.transport_failed(exc) from exc
        except APIError as exc:  # past the cap or the deadline
            raise failed_after_hand_over(call, exc) from None
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        self._body.whole = True

    async def close(self) -> None:
        """Close the response, even from a cancelled task."""
        response = self.http_response
        await _aclose_response(_held(self._stream(), response)[0], response, self._body)

    def __del__(self) -> None:
        """Left open (an ``async with`` block never left): closed by a task on its loop,
        or off it by the reaper thread (``_call/unclosed.py``), with a warning."""
        body: _Body | None = getattr(self, "_body", None)
        if body is None or body.ended:
            return
        response = self.http_response
        state, held = _held(self._stream(), response)
        aclose_later(
            getattr(self, "_loop", None),
            partial(_aclose_response, state, response, body),
            partial(_ended_off_loop, state, body),
        )
        if held:
            warn_unclosed(self, _left(self, "await response.close()"))


async def _aclose_response(
    state: StreamState[Any] | None, response: httpx.Response, body: _Body
) -> None:
    """The async twin of ``_close_response``: the close shielded from cancellation."""
    try:
        if state is not None:
            await _aclose(state)
        else:
            with anyio.CancelScope(shield=True):
                await response.aclose()
    finally:
        body.close()


def _ended_off_loop(state: StreamState[Any] | None, body: _Body) -> None:
    """An async response left after its loop closed: its connection goes with the
    loop; its stream's slot is given back and its call ended."""
    try:
        if state is not None:
            state.closed_early()
    finally:
        body.close()


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
            try:
                chunk = await anext_within(pieces, state.call.remaining_or_none())
            except StopAsyncIteration:
                break
            state.passing_through(chunk)
            yield chunk
    except http_errors(TimeoutError) as exc:
        raise state.transport_failed(exc) from exc
    state.passed_through()
