"""Streamed responses: ``Stream`` (sync) and ``AsyncStream`` over one shared decoder.

``_StreamState`` does all the work that is not I/O (SSE decoding, ``[DONE]``,
error events, the end-of-stream check, the deadline, the size cap); the two
stream classes only pull bytes from httpx and hand them over. Both close the
HTTP response as soon as the stream ends, fails, is closed, or is left early
(``with`` block, ``break``, garbage collection of the iterator's owner, task
cancellation), so the server sees the disconnect and can stop generating.

Two dialects of SSE: chat and completions (chunks, an ``error`` member for a
failure, ``data: [DONE]`` at the end) and the Responses API (typed events,
``type: "error"`` or ``response.failed`` for a failure, ``response.completed``
or ``response.incomplete`` as the last event: its stream has no ``[DONE]``).
Either way a failure event is raised as the ``APIStatusError`` of its code
(500 when it names none), and a stream that stops before its end is
``StreamInterruptedError``; events of a type stormguard does not know are
handed on like the others.

The bytes come decoded in pieces of at most 64 KiB (``_body.iter_body``), each
counted against ``max_response_bytes``, and the deadline is checked before each
piece and every 512 events of a piece: a compressed stream of blank lines or
of tiny events ends at the cap or the deadline, however fast it inflates.

A call with ``StreamTimeouts`` reads its bytes through ``_bounded`` or
``_abounded`` (``Stream._bytes``, which the other readers of a stream iterate
too: ``with_streaming_response`` and transport mode): each wait for more bytes
is held to the stream's bounds, the first chunk's before the hand-over and the
idle gap after it (``_stream_timeouts.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio

from ._body import BodyLimit, BodyTooLargeError, aiter_body, iter_body
from ._events import ResponseSummary
from ._exceptions import (
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    StreamInterruptedError,
)
from ._http import http_errors, httpx, library_of, timeout_errors
from ._models import CallInfo, Record, ResponseStreamEvent
from ._responses import error_from_payload, parse_json_object, request_id_of
from ._sse import EventTooLargeError, ServerSentEvent, SSEDecoder

if TYPE_CHECKING:
    from ._history import AttemptRecord
    from ._pipeline import LogicalCall
    from ._rate_limit_headers import RateLimit
    from .protocol import ServerLoad

__all__ = ["AsyncStream", "Stream"]

T = TypeVar("T", bound=Record)

#: The deadline is checked again after this many events of one piece (a power of 2, - 1).
_EVENTS_PER_CHECK = 511


def _is_done(event: ServerSentEvent) -> bool:
    return event.data.strip() == "[DONE]"


def _names_error(event: ServerSentEvent, payload: Mapping[str, Any]) -> bool:
    """An error sent inside a 200 stream: vLLM's shape, or an ``error`` event."""
    return event.event == "error" or "error" in payload


#: The Responses API's last events: the stream ends with the one that comes.
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete"})
_RESPONSE_FAILURES = frozenset({"error", "response.failed"})
#: Codes of a Responses API failure event that name a status (others are a 500).
_RESPONSE_ERROR_STATUS = {"rate_limit_exceeded": 429, "server_error": 500}


def _response_event_type(event: ServerSentEvent, payload: Mapping[str, Any]) -> str | None:
    kind = payload.get("type", event.event)
    return kind if isinstance(kind, str) else event.event


def _response_failure(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The error of a Responses API failure event in the shape of an error body: an
    ``error`` event carries ``code``/``message``/``param`` itself, ``response.failed``
    in ``response.error``."""
    if kind == "response.failed":
        response = payload.get("response")
        error = response.get("error") if isinstance(response, Mapping) else None
        found = dict(error) if isinstance(error, Mapping) else {}
        found.setdefault("message", "The response failed")
    else:
        found = {k: payload[k] for k in ("code", "message", "param") if k in payload}
    return {"error": found}


def _response_failure_status(body: Mapping[str, Any]) -> int | None:
    code = body["error"].get("code")
    return _RESPONSE_ERROR_STATUS.get(code) if isinstance(code, str) else None


class _StreamState(Generic[T]):
    """Decoding and bookkeeping shared by both stream classes."""

    def __init__(self, call: LogicalCall, response: httpx.Response, chunk_type: type[T]) -> None:
        self.call = call
        self.response = response
        self.chunk_type = chunk_type
        #: The stream's first-chunk and idle bounds (None: the call's deadline alone).
        self.bounds = call.stream_bounds
        self.decoder = SSEDecoder()
        #: The decoded bytes of the stream so far, against ``max_response_bytes``.
        self.limit = BodyLimit(call.core.max_response_bytes)
        self.pending: deque[T] = deque()
        self.done = False
        self.closed = False
        self.in_caller_hands = False
        self.failure: APIError | None = None
        self.usage_total: object = None
        #: Usage and finish reasons seen in the chunks (for the call's telemetry).
        self.usage: dict[str, Any] | None = None
        self.finish_reasons: list[str] = []
        self.raw_prefix: list[bytes] = []
        self.first_model: str | None = None
        self.response_id: str | None = None
        self.delivered = 0
        #: Typed events of the Responses API (no ``[DONE]``: a last event instead).
        self.responses_api = issubclass(chunk_type, ResponseStreamEvent)
        self.info = CallInfo(
            server_load=call.server_load,
            attempt_history=(),
            request_id=request_id_of(response, redactor=call.redactor),
            model=call.spec.model,
            rate_limit=call.rate_limit,
        )
        content_type = response.headers.get("content-type", "")
        if "text/event-stream" not in content_type.lower():
            raise call.failed(
                APIResponseValidationError(
                    "Expected an event stream, got content-type"
                    f" {call.redactor.quote(content_type, 100)!r}",
                    status_code=response.status_code,
                    server_load=call.server_load,
                    request_id=self.info.request_id,
                )
            )

    # Errors raised after the first chunk reached the caller are not retried; they
    # still carry the call's attempt history.
    def _raise(self, error: APIError) -> APIError:
        if error.request is None:
            error.request = self.response.request
        if not self.in_caller_hands:
            return self.call.failed(error)
        self.call.annotate(error)
        self.call.ended(error, response=self.summary())
        return error

    def check_deadline(self) -> None:
        if self.call.deadline.expired:
            raise self._raise(self._timed_out("The call's deadline passed during the stream"))

    def _timed_out(self, message: str) -> APITimeoutError:
        """The timeout of the stream: ``message`` when the call's deadline (or an httpx
        timeout) ended it; what the stream's bound says when one of them did. A
        first chunk that did not come in time is retried (``response_started`` False:
        no event came)."""
        bounds = self.bounds
        reason = None if bounds is None else bounds.timeout_reason()
        started = True
        if bounds is not None and reason is not None:
            started = not bounds.first_chunk_passed
            message = f"{reason[0].upper()}{reason[1:]}"
            if started:
                message += f", after {self.delivered} chunks"
        return APITimeoutError(
            message,
            response_started=started,
            server_load=self.call.server_load,
            request_id=self.info.request_id,
        )

    def idle_timeout(self) -> httpx.TimeoutException:
        """The error a read ends with when the idle gap passed without bytes: an httpx
        timeout, as a read cut by the connection raises (transport mode hands it on)."""
        assert self.bounds is not None
        library = library_of(self.response)
        error: httpx.TimeoutException = library.ReadTimeout(
            self.bounds.idle_passed(), request=self.response.request
        )
        return error

    def _count(self, piece: bytes) -> None:
        try:
            self.limit.add(len(piece))
        except BodyTooLargeError:
            raise self._raise(
                APIResponseValidationError(
                    f"The stream exceeds max_response_bytes={self.limit.limit} (decoded bytes)",
                    status_code=self.response.status_code,
                    server_load=self.call.server_load,
                    request_id=self.info.request_id,
                )
            ) from None

    def feed(self, raw: bytes) -> None:
        """Decode one piece (at most 64 KiB); past the cap or the deadline, fail."""
        self._count(raw)
        self.check_deadline()
        if self.call.spec.replays_stream and not self.in_caller_hands:
            self.raw_prefix.append(raw)  # replayed to the transport's caller as it came
        try:
            events = self.decoder.feed(raw)
        except EventTooLargeError as exc:
            raise self._raise(
                APIResponseValidationError(
                    str(exc),
                    status_code=self.response.status_code,
                    server_load=self.call.server_load,
                )
            ) from None
        for index, event in enumerate(events):
            if self.done:
                break
            if index & _EVENTS_PER_CHECK == _EVENTS_PER_CHECK:
                self.check_deadline()  # a piece of tiny events is thousands of parses
            error = self._event(event)
            if error is not None:
                # Chunks decoded before the error are still the caller's: raise
                # the error once they have been handed out.
                self.failure = error
                self.done = True
                break
        if not self.pending:
            self.raise_failure()

    def raise_failure(self) -> None:
        if self.failure is not None:
            error, self.failure = self.failure, None
            raise self._raise(error)

    def _event(self, event: ServerSentEvent) -> APIError | None:
        if _is_done(event):
            self.done = True
            return None
        payload = parse_json_object(event.data.encode())
        if payload is None:
            return APIResponseValidationError(
                "A stream event is not a JSON object:"
                f" {self.call.redactor.quote(event.data, 80)!r}",
                status_code=self.response.status_code,
                server_load=self.call.server_load,
                request_id=self.info.request_id,
            )
        if self.responses_api:
            return self._response_event(event, payload)
        if _names_error(event, payload):
            return self._error_event(payload)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.usage_total = usage.get("total_tokens")
            self.usage = usage
        choices = payload.get("choices")
        if choices and isinstance(choices, list):
            for choice in choices:
                reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                if isinstance(reason, str):
                    self.finish_reasons.append(reason)
        self.pending.append(self.chunk_type(payload))
        return None

    def _response_event(
        self, event: ServerSentEvent, payload: Mapping[str, Any]
    ) -> APIError | None:
        """One Responses API event: a failure is an error; the usage and status of the
        response it carries are noted; the last event ends the stream."""
        kind = _response_event_type(event, payload)
        if kind in _RESPONSE_FAILURES or event.event == "error":
            failure = _response_failure(kind or "error", payload)
            return self._error_event(failure, _response_failure_status(failure))
        response = payload.get("response")
        if isinstance(response, Mapping):
            usage = response.get("usage")
            if isinstance(usage, Mapping):
                self.usage_total = usage.get("total_tokens")
                self.usage = {
                    "prompt_tokens": usage.get("input_tokens"),
                    "completion_tokens": usage.get("output_tokens"),
                }
            status = response.get("status")
            if kind in _RESPONSE_ENDS and isinstance(status, str):
                self.finish_reasons.append(status)
        self.pending.append(self.chunk_type(payload))
        if kind in _RESPONSE_ENDS:
            self.done = True
        return None

    def _error_event(self, payload: Any, status: int | None = None) -> APIError:
        """An error sent inside a 200 stream (vLLM does this when it sheds a streaming
        request): the error class of ``status``, else of the code it names, else 500."""
        error = payload.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        if isinstance(code, str) and code.isdigit():
            code = int(code)
        if status is None:
            status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        return error_from_payload(
            status,
            payload,
            server_load=self.call.server_load,
            request_id=self.info.request_id,
            response=self.response,
            redactor=self.call.redactor,
        )

    def end_of_body(self) -> None:
        self.check_deadline()
        if not self.done:
            partial = " in the middle of an event" if self.decoder.has_partial_event else ""
            end = "its last event" if self.responses_api else "[DONE]"
            raise self._raise(
                StreamInterruptedError(
                    f"The stream ended{partial} before {end}, after {self.delivered} chunks",
                    chunks_received=self.delivered,
                    server_load=self.call.server_load,
                    request_id=self.info.request_id,
                )
            )

    def transport_failed(self, exc: Exception) -> APIError:
        return self._raise(self._transport_error(exc))

    def _transport_error(self, exc: Exception) -> APIError:
        if isinstance(exc, timeout_errors(TimeoutError)):
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return self._timed_out(
                # A bare TimeoutError is the cancel scope of the call's deadline (async).
                "The call's deadline passed during the stream"
                if isinstance(exc, TimeoutError)
                else f"Timed out during the stream ({detail})"
            )
        return StreamInterruptedError(
            f"The stream was cut off after {self.delivered} chunks ({type(exc).__name__})",
            chunks_received=self.delivered,
            server_load=self.call.server_load,
            request_id=self.info.request_id,
        )

    def finished(self) -> None:
        """The stream reached ``[DONE]``: settle the token reservation with its usage
        (``stream_options={"include_usage": True}``); without usage it stays spent."""
        self.call.settle_tokens(self.usage_total)
        self.call.ended(response=self.summary())

    def passing_through(self, raw: bytes) -> None:
        """Transport mode: raw bytes go to the caller, who decodes them. They are
        decoded here too, only to learn how the stream ends: at ``[DONE]`` (which
        openai-python closes the response at, before its end), or with an error
        event (a crash's 503, a 500): the call fails, and the concurrency limit
        hears that the server lost the stream. Past the cap or the deadline (also
        after ``[DONE]``: openai-python reads a stream to its end) the call's error
        is raised, for the transport to hand on as an httpx error."""
        self._count(raw)
        self.check_deadline()
        if self.done:
            return
        try:
            events = self.decoder.feed(raw)
        except EventTooLargeError:
            events = []  # the caller's decoder has its own limit; this one stops looking
            self.done = True
        for event in events:
            if self.responses_api:
                if self._passing_response_event(event):
                    return
                continue
            if _is_done(event):
                self.done = True
                self.call.ended(response=self.summary())
                return
            if event.event == "error" or '"error"' in event.data:  # others skip the parse
                payload = parse_json_object(event.data.encode())
                if payload is not None and _names_error(event, payload):
                    self.done = True
                    self.call.ended(self._error_event(payload), response=self.summary())
                    return

    def _passing_response_event(self, event: ServerSentEvent) -> bool:
        """Transport mode, Responses API: whether ``event`` ended the stream (its last
        event, or a failure). Only the events that may end it are parsed; their type
        is in the ``event:`` line, or else in the data."""
        name = event.event
        if name is not None and name not in _RESPONSE_ENDS and name not in _RESPONSE_FAILURES:
            return False
        if name is None and not any(
            f'"{kind}"' in event.data for kind in (*_RESPONSE_ENDS, *_RESPONSE_FAILURES)
        ):
            return False
        payload = parse_json_object(event.data.encode())
        if payload is None:
            return False
        error = self._response_event(event, payload)
        self.pending.clear()  # the caller decodes the events; only their end matters here
        if error is None and not self.done:
            return False
        self.done = True
        self.call.ended(error, response=self.summary())
        return True

    def passed_through(self, cut: Exception | None = None) -> None:
        """Transport mode: the caller read the raw body to its end, or the connection
        failed under it (``cut``); an end without ``[DONE]`` is a cut stream too."""
        if self.done and cut is None:
            self.call.ended(self.failure, response=self.summary())
            return
        self.done = True
        error: APIError
        if cut is not None and isinstance(cut, timeout_errors(TimeoutError)):
            error = self._transport_error(cut)  # the deadline, not the server, ended it
        else:
            how = f" ({type(cut).__name__})" if cut is not None else " before [DONE]"
            error = StreamInterruptedError(
                f"The stream was cut off{how}",
                server_load=self.call.server_load,
                request_id=self.info.request_id,
            )
        self.call.ended(error, response=self.summary())

    def closed_early(self) -> None:
        """The caller closed the stream (or left it): the call ends, as cancelled, if it
        had not ended yet. Before the first chunk a close is the driver's, not the end.
        Either way the server's work on it is over: its concurrency slot is free."""
        self.call.release_slot()
        if self.in_caller_hands:
            self.call.ended(cancelled=True, response=self.summary())

    def summary(self) -> ResponseSummary:
        usage = self.usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return ResponseSummary(
            response_id=self.response_id or self.info.request_id,
            response_model=self.first_model,
            finish_reasons=tuple(self.finish_reasons),
            input_tokens=prompt if isinstance(prompt, int) else None,
            output_tokens=completion if isinstance(completion, int) else None,
        )

    def take(self) -> T:
        self.delivered += 1
        return self.pending.popleft()

    def started(self) -> None:
        """The first chunk is in hand: the attempt succeeded, no more retries."""
        self.in_caller_hands = True
        if self.bounds is not None:
            self.bounds.handed_over()
        self.call.succeeded_info(self.info)
        if self.pending:
            first = self.pending[0]
            response = first.get("response") if self.responses_api else None
            if isinstance(response, Mapping):  # an event's id and model are its response's
                model, chunk_id = response.get("model"), response.get("id")
            else:
                model, chunk_id = first.get("model"), first.get("id")
            self.first_model = model if isinstance(model, str) else None
            self.response_id = chunk_id if isinstance(chunk_id, str) else None
        self.call.first_chunk(self.response_id or self.info.request_id, self.first_model)


class _StreamBase(Generic[T]):
    _state: _StreamState[T]

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


class Stream(_StreamBase[T]):
    """Iterator of chunks of a streamed completion; also a context manager."""

    def __init__(self, state: _StreamState[T]) -> None:
        self._state = state
        self._bytes = iter_body(state.response)
        if state.bounds is not None:
            self._bytes = _bounded(self._bytes, state)

    def _read_more(self) -> None:
        state = self._state
        if state.bounds is None:  # else ``_bounded`` checks, with the idle bound renewed
            state.check_deadline()
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
        try:
            while not state.pending:
                state.raise_failure()
                if state.done or state.closed:
                    state.finished()
                    self.close()
                    raise StopIteration
                self._read_more()
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise
        return state.take()

    def close(self) -> None:
        """Close the HTTP response; the server sees the disconnect."""
        if not self._state.closed:
            self._state.closed = True
            self._state.response.close()
            self._state.closed_early()

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
        state = getattr(self, "_state", None)
        if state is not None and not state.closed:
            self.close()


class AsyncStream(_StreamBase[T]):
    """Async iterator of chunks of a streamed completion; also an async context manager.

    Cancelling the task that iterates it closes the response at once.
    """

    def __init__(self, state: _StreamState[T]) -> None:
        self._state = state
        self._bytes = aiter_body(state.response)
        if state.bounds is not None:
            self._bytes = _abounded(self._bytes, state)

    async def _read_more(self) -> None:
        state = self._state
        state.check_deadline()
        try:
            with anyio.fail_after(state.call.remaining_or_none()):
                raw = await self._bytes.__anext__()
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
        try:
            while not state.pending:
                state.raise_failure()
                if state.done or state.closed:
                    state.finished()
                    await self.aclose()
                    raise StopAsyncIteration
                await self._read_more()
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.aclose()
            raise
        return state.take()

    async def aclose(self) -> None:
        """Close the HTTP response, even from a cancelled task."""
        if not self._state.closed:
            self._state.closed = True
            with anyio.CancelScope(shield=True):
                await self._state.response.aclose()
            self._state.closed_early()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _bounded(pieces: Iterator[bytes], state: _StreamState[Any]) -> Iterator[bytes]:
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


async def _abounded(pieces: AsyncIterator[bytes], state: _StreamState[Any]) -> AsyncIterator[bytes]:
    """``pieces`` read within the stream's bounds (async): each read after the
    hand-over in a cancel scope of the idle bound (the reader's own scope, computed
    before the read, holds the deadline: the first chunk's, the total or the cap)."""
    bounds = state.bounds
    assert bounds is not None
    while True:
        idle = bounds.before_read(clip=False)
        state.check_deadline()
        try:
            with anyio.fail_after(idle):
                piece = await pieces.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise state.idle_timeout() from None
        if bounds.after_read():
            raise state.idle_timeout()
        yield piece
