"""A started stream handed to the transport's caller: the bytes stormguard read to
know it had started, then the rest, each read bounded by the call's deadline and
its errors given as the caller's HTTP library's (to openai-python: the call's own
error, as the class that is also openai's, as ``answers.raised_for``)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .._call.streaming import AsyncStream, Stream
from .._core.exceptions import StormguardError
from .._core.http import httpx, library_of, transport_errors
from .._io.read_within import anext_within
from .answers import from_openai, in_library_of, raised_for

__all__ = ["areplay", "replay"]


def replay(stream: Stream[Any], request: httpx.Request) -> Iterator[bytes]:
    """The bytes read while deciding the stream had started, then the rest; errors
    as the caller's library's (``request``'s)."""
    state = stream._state
    if state.done:  # the whole stream came while it was starting
        state.passed_through()
    yield from state.raw_prefix  # decoded already, while the stream was starting
    try:
        # Each read ends by the call's deadline: the connection keeps it.
        for chunk in stream._bytes:
            state.passing_through(chunk)
            yield chunk
    except transport_errors() as exc:
        raise _cut(request, exc, state.passed_through(cut=exc)) from None
    except StormguardError as error:  # past the cap or the deadline
        raised = raised_for(error, request)
        if raised is error:  # openai-python's caller: the call's own error
            raise
        raise raised from error
    _end(request, state.passed_through())


async def areplay(stream: AsyncStream[Any], request: httpx.Request) -> AsyncIterator[bytes]:
    """The async twin of :func:`replay`; each read that waits ends by the call's
    deadline (``anext_within``, as a stream's own reads)."""
    state = stream._state
    if state.done:  # the whole stream came while it was starting
        state.passed_through()
    for chunk in state.raw_prefix:  # decoded already, while the stream was starting
        yield chunk
    pieces, deadline = stream._bytes, state.call.deadline
    lib = library_of(request)
    try:
        while True:
            left = deadline.remaining()
            try:
                chunk = await anext_within(pieces, left if math.isfinite(left) else None)
            except StopAsyncIteration:
                break
            except TimeoutError:
                # What passed: the call's deadline, or a stream bound (max_duration).
                passed = deadline.passed
                raise lib.ReadTimeout(
                    f"{passed[0].upper()}{passed[1:]} during the stream", request=request
                ) from None
            state.passing_through(chunk)
            yield chunk
    except transport_errors() as exc:
        raise _cut(request, exc, state.passed_through(cut=exc)) from None
    except StormguardError as error:  # past the cap or the deadline
        raised = raised_for(error, request)
        if raised is error:  # openai-python's caller: the call's own error
            raise
        raise raised from error
    _end(request, state.passed_through())


def _end(request: httpx.Request, error: StormguardError | None) -> None:
    """The body ended: a stream that is not complete (no ``[DONE]``, a choice not
    finished) is the call's error to openai-python, which would end it quietly and
    hand its caller half an answer as the whole; any other caller has the bytes as
    the server sent them."""
    if error is not None and from_openai(request):
        raise raised_for(error, request)


def _cut(
    request: httpx.Request, exc: httpx.TransportError, error: StormguardError | None
) -> Exception:
    """What the caller reading a stream gets when the connection failed under it
    (``error``: the call's error for it): ``exc`` as the caller's library's, or to
    openai-python the call's error (:func:`raised_for`)."""
    if error is not None and from_openai(request):
        return raised_for(error, request)
    return in_library_of(request, exc)


class _ReplayStream(httpx.SyncByteStream):
    """:func:`replay` as httpx's byte stream."""

    def __init__(self, stream: Stream[Any], request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __iter__(self) -> Iterator[bytes]:
        return replay(self._stream, self._request)

    def close(self) -> None:
        self._stream.close()


class _AsyncReplayStream(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncStream[Any], request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __aiter__(self) -> AsyncIterator[bytes]:
        return areplay(self._stream, self._request)

    async def aclose(self) -> None:
        await self._stream.aclose()
