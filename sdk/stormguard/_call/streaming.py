"""Streamed responses: ``Stream`` (sync) and ``AsyncStream`` over one shared decoder.

``StreamState`` does all the work that is not I/O (SSE decoding, ``[DONE]``,
error events, the end-of-stream check, the deadline, the size cap: the stack of
``_call/stream_core.py``, ``_call/stream_events.py`` and ``_call/stream_state.py``); the two
stream classes only pull bytes from httpx and hand them over. Both close the
HTTP response as soon as the stream ends, fails, is closed, or is left early
(``with`` block, task cancellation), so the server sees the disconnect and can
stop generating. A stream the caller left without closing it (``break`` out of
``for``/``async for``, then nothing) is closed when it is collected, with a
``ResourceWarning`` (``_call/unclosed.py``: on its loop, or by a thread of its own):
its connection closed, its concurrency slot given back, its call ended as
cancelled.

A call with ``StreamTimeouts`` reads its bytes through ``_bounded`` or
``_abounded`` (``Stream._bytes``, which the other readers of a stream iterate
too: ``with_streaming_response`` and transport mode): each wait for more bytes
is held to the stream's bounds, the first chunk's before the hand-over and the
idle gap after it (``_call/stream_timeouts.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic

import anyio

from .._core.http import http_errors, httpx
from .._core.redact import display_url
from .._core.results import CallInfo
from .._io.body import aiter_body, iter_body
from .._io.pool_life import running_loop
from .._io.read_within import anext_within
from .stream_core import T
from .stream_state import StreamState
from .unclosed import aclose_later, close_later, warn_unclosed

if TYPE_CHECKING:
    from .._core.history import AttemptRecord
    from .._core.rate_limit_headers import RateLimit
    from ..protocol import ServerLoad

__all__ = ["AsyncStream", "Stream"]


class _StreamBase(Generic[T]):
    _state: StreamState[T]

    @property
    def response(self) -> httpx.Response:
        """The underlying httpx response (headers, status)."""
        return self._state.response

    @property
    def call_info(self) -> CallInfo:
        return self._state.info

    @property
    def rate_limit(self) -> RateLimit:
        """The ``x-ratelimit-*`` headers of the response that carries this stream."""
        return self._state.info.rate_limit

    @property
    def server_load(self) -> ServerLoad:
        """Load headers of the response that carries this stream."""
        return self._state.info.server_load

    @property
    def attempt_history(self) -> tuple[AttemptRecord, ...]:
        return self._state.info.attempt_history

    @property
    def attempts(self) -> int:
        return len(self._state.info.attempt_history)

    @property
    def chunks_received(self) -> int:
        """Chunks handed to the caller so far."""
        return self._state.delivered

    def _claim(self) -> StreamState[T] | None:
        """The stream's state if it is still open, marked closed now: whoever claims
        it closes it (``close``, ``aclose``, or the finalizer), once."""
        state: StreamState[T] | None = getattr(self, "_state", None)  # None: __init__ failed
        if state is None or state.closed:
            return None
        state.closed = True
        return state

    def __repr__(self) -> str:
        state = self._state
        request = state.response.request
        url = state.call.redactor.scrub(display_url(request.url))
        return f"<{type(self).__name__} {request.method} {url}, {state.delivered} chunks>"


class Stream(_StreamBase[T]):
    """Iterator of chunks of a streamed completion; also a context manager."""

    def __init__(self, state: StreamState[T]) -> None:
        self._state = state
        self._bytes = iter_body(state.response)
        if state.bounds is not None:
            self._bytes = _bounded(self._bytes, state)

    def _read_more(self) -> None:
        # The deadline is looked at after each read (``feed``), and a read on the
        # client's connections waits no longer than it (``_bounded`` renews a
        # stream's idle bound before each).
        state = self._state
        try:
            raw = next(self._bytes)
        except StopIteration:
            state.end_of_body()
            return
        except http_errors() as exc:
            raise state.transport_failed(exc) from exc
        state.feed(raw)

    def _prefetch(self) -> None:
        """Read until the first chunk (or the end): failures so far are retryable."""
        state = self._state
        try:
            while not state.pending and not state.done:
                self._read_more()
        except BaseException:
            self.close()
            raise
        state.started()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        state = self._state
        if state.pending:  # a chunk decoded already (most calls): ``take``, inline
            state.delivered += 1
            return state.pending.popleft()
        try:
            while not state.pending:
                state.raise_failure()
                if state.done or state.closed:
                    state.finished()
                    self.close()
                    raise StopIteration
                if state.unread:
                    state.advance()
                else:
                    self._read_more()
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise
        return state.take()

    def close(self) -> None:
        """Close the HTTP response; the server sees the disconnect."""
        state = self._claim()
        if state is not None:
            _close(state)

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        """Left unclosed: closed by the reaper thread (``_call/unclosed.py``), with a warning."""
        state = self._claim()
        if state is not None:
            close_later(partial(_close, state))
            warn_unclosed(self, _left(self, "stream.close()"))


class AsyncStream(_StreamBase[T]):
    """Async iterator of chunks of a streamed completion; also an async context manager.

    Cancelling the task that iterates it closes the response at once.
    """

    def __init__(self, state: StreamState[T]) -> None:
        self._state = state
        self._bytes = aiter_body(state.response)
        if state.bounds is not None:
            self._bytes = _abounded(self._bytes, state)
        #: The loop it is read on, which closes it if it is left unclosed.
        self._loop = running_loop()

    async def _read_more(self) -> None:
        state = self._state
        bound = state.read_bound()
        try:
            raw = await anext_within(self._bytes, bound)
        except StopAsyncIteration:
            state.end_of_body()
            return
        except http_errors(TimeoutError) as exc:
            raise state.transport_failed(exc) from exc
        state.feed(raw)

    async def _prefetch(self) -> None:
        state = self._state
        try:
            while not state.pending and not state.done:
                await self._read_more()
        except BaseException:
            await self.aclose()
            raise
        state.started()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        state = self._state
        if state.pending:  # a chunk decoded already (most calls): ``take``, inline
            state.delivered += 1
            return state.pending.popleft()
        try:
            while not state.pending:
                state.raise_failure()
                if state.done or state.closed:
                    state.finished()
                    await self.aclose()
                    raise StopAsyncIteration
                if state.unread:
                    state.advance()
                else:
                    await self._read_more()
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.aclose()
            raise
        return state.take()

    async def aclose(self) -> None:
        """Close the HTTP response, even from a cancelled task."""
        state = self._claim()
        if state is not None:
            await _aclose(state)

    #: openai-python's name for it (``await stream.close()``).
    close = aclose

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        """Left unclosed: closed by a task on its loop, or off it by the reaper thread
        (``_call/unclosed.py``), with a warning."""
        state = self._claim()
        if state is not None:
            aclose_later(self._loop, partial(_aclose, state), state.closed_early)
            warn_unclosed(self, _left(self, "await stream.aclose()"))


def _close(state: StreamState[Any]) -> None:
    """Close a claimed stream's response, then give its slot back and end its call
    (as cancelled if it had not ended), even when the close fails."""
    try:
        state.response.close()
    finally:
        state.closed_early()


async def _aclose(state: StreamState[Any]) -> None:
    """The async twin of ``_close``: the close shielded from cancellation."""
    try:
        with anyio.CancelScope(shield=True):
            await state.response.aclose()
    finally:
        state.closed_early()


def _left(stream: _StreamBase[Any], close: str) -> str:
    """The warning of a stream left unclosed."""
    try:
        shown = repr(stream)
    except Exception:  # Python shutting down: its name will do
        shown = type(stream).__name__
    return (
        f"Unclosed {shown}: its connection is closed and its concurrency slot given"
        f" back now, and its call ends as cancelled. Close it ({close}, or a with block)"
        " or read it to its end"
    )


def _bounded(pieces: Iterator[bytes], state: StreamState[Any]) -> Iterator[bytes]:
    """``pieces`` read within the stream's bounds (sync): before each read the idle
    bound is renewed in the deadline the connection clips its reads to, and the
    deadline (the first chunk's, the total or the cap) is checked."""
    bounds = state.bounds
    assert bounds is not None
    while True:
        bounds.before_read(clip=True)
        state.check_deadline()
        try:
            piece = next(pieces)
        except StopIteration:
            return
        if bounds.after_read():
            raise state.idle_timeout()
        yield piece


async def _abounded(pieces: AsyncIterator[bytes], state: StreamState[Any]) -> AsyncIterator[bytes]:
    """``pieces`` read within the stream's bounds (async): each read after the
    hand-over held to the idle bound (``anext_within``; the reader's own bound,
    computed before the read, holds the deadline: the first chunk's, the total or
    the cap)."""
    bounds = state.bounds
    assert bounds is not None
    while True:
        idle = bounds.before_read(clip=False)
        state.check_deadline()
        try:
            piece = await anext_within(pieces, idle)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise state.idle_timeout() from None
        if bounds.after_read():
            raise state.idle_timeout()
        yield piece
