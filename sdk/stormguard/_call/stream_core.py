"""The state of one stream and the errors that end it (``StreamCore``).

The bottom of ``StreamState``'s stack, shared by both stream classes and by every
reader of a stream's bytes: what the stream has seen so far, the call's deadline
and the stream's bounds, the size cap on its decoded bytes, and each way it may
fail (a timeout, a cut, an end before its last event, bytes past the cap), and
what makes a stream complete when its body ends (``complete_at_end``). An
error raised before the first chunk reached the caller fails the attempt, which
may be retried; after, it ends the call. Above it: ``_call/stream_events.py`` (what
each event means) and ``_call/stream_state.py`` (reading the stream).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._core.deadline import MIN_ATTEMPT_TIME
from .._core.exceptions import (
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    ClientClosedError,
    StreamInterruptedError,
)
from .._core.http import httpx, library_of, timeout_errors
from .._core.record_shapes import ChunkCheck, shape_of
from .._core.results import CallInfo, Record, ResponseStreamEvent
from .._io.body import BodyLimit, BodyTooLargeError
from .._io.decoding import request_id_of
from .._io.sse import ServerSentEvent, SSEDecoder
from ..telemetry._events import ResponseSummary

if TYPE_CHECKING:
    from .._core.deadline import Deadline
    from .._core.exceptions import StormguardError
    from .._core.rate_limit_headers import RateLimit
    from .._core.redact import Redactor
    from ..protocol import ServerLoad
    from .call_spec import CallSpec
    from .client_core import ClientCore
    from .stream_timeouts import StreamBounds

__all__ = ["StreamCore", "StreamingCall", "T", "choices_asked"]

T = TypeVar("T", bound=Record)


def choices_asked(body: Mapping[str, Any] | None) -> int:
    """The choices a request asks for: its ``n``, 1 when it names none (or none valid)."""
    n = body.get("n") if body is not None else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


class StreamingCall(Protocol):
    """What a stream reads and moves of the call it belongs to (``LogicalCall`` is
    one): the stream modules sit below the call's, which make the streams."""

    spec: CallSpec
    core: ClientCore
    deadline: Deadline
    stream_bounds: StreamBounds | None
    http: httpx.Client | httpx.AsyncClient | None
    redactor: Redactor
    server_load: ServerLoad
    rate_limit: RateLimit

    def failed(self, error: APIError) -> APIError: ...
    def first_chunk(self, response_id: str | None, response_model: str | None) -> None: ...
    def settle(self, usage: object) -> None: ...
    def succeeded_info(self, info: CallInfo) -> None: ...
    def annotate(self, error: StormguardError) -> None: ...
    def release_slot(self) -> None: ...
    def remaining_or_none(self) -> float | None: ...
    def ended(
        self,
        error: BaseException | None = None,
        *,
        cancelled: bool = False,
        response: ResponseSummary | None = None,
    ) -> None: ...


class StreamCore(Generic[T]):
    """What one stream has seen so far, and the errors that end it."""

    def __init__(self, call: StreamingCall, response: httpx.Response, chunk_type: type[T]) -> None:
        self.call = call
        self.response = response
        self.chunk_type = chunk_type
        #: The stream's first-chunk and idle bounds (None: the call's deadline alone).
        self.bounds = call.stream_bounds
        self.decoder = SSEDecoder()
        #: The decoded bytes of the stream so far, against ``max_response_bytes``.
        self.limit = BodyLimit(call.core.max_response_bytes)
        self.pending: deque[T] = deque()
        #: The events of the last piece fed, read into chunks from ``unread_at`` on
        #: as the caller takes them (``StreamState.advance``).
        self.unread: list[ServerSentEvent] = []
        self.unread_at = 0
        self.done = False
        self.closed = False
        self.in_caller_hands = False
        self.failure: APIError | None = None
        #: Usage and finish reasons seen in the chunks (for the call's telemetry).
        self.usage: dict[str, Any] | None = None
        self.finish_reasons: list[str] = []
        self.raw_prefix: list[bytes] = []
        self.first_model: str | None = None
        self.response_id: str | None = None
        self.delivered = 0
        #: Typed events of the Responses API (no ``[DONE]``: a last event instead).
        self.responses_api = issubclass(chunk_type, ResponseStreamEvent)
        #: The choices the request asked for (``n``), and those a ``finish_reason``
        #: ended so far: a body that ends cleanly once all have ended is complete.
        self.choices_asked = choices_asked(call.spec.body)
        self.choices_finished: set[int] = set()
        #: The check of each chunk against its shape (``_core/record_shapes.py``); None
        #: in transport mode, whose caller decodes the events itself.
        self.chunk_check = None if call.spec.raw else ChunkCheck(shape_of(chunk_type))
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
        """Fail the stream once the call's deadline has passed."""
        self.read_bound()

    def read_bound(self) -> float | None:
        """``check_deadline``, then the seconds left for the next read (None: no
        deadline), from one look at the clock: an async read asks both per chunk."""
        left = self.call.deadline.remaining()
        if left < MIN_ATTEMPT_TIME:  # what ``Deadline.expired`` says, on the same look
            raise self._raise(self._timed_out("The call's deadline passed during the stream"))
        return left if math.isfinite(left) else None

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

    def note_finishes(self, choices: object) -> None:
        """Note the choices of one chunk that carry their ``finish_reason`` (for the
        call's telemetry, and for ``complete_at_end``)."""
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            if not isinstance(reason, str):
                continue
            self.finish_reasons.append(reason)
            index = choice.get("index", position)
            if isinstance(index, int) and 0 <= index < self.choices_asked:
                self.choices_finished.add(index)  # bounded: at most ``n`` of them

    def complete_at_end(self) -> bool:
        """The body ended: whether the stream is complete. It is at ``[DONE]`` (or the
        Responses API's last event); and a chat or completions stream whose body ends
        between two events once every choice asked for has had its
        ``finish_reason`` is complete too. Some OpenAI-compatible servers and proxies
        send no ``[DONE]``; openai-python ends such a stream quietly, and LiteLLM
        reads it as complete once a ``finish_reason`` came. Anything else is a cut."""
        if not self.done and not self.responses_api and not self.decoder.has_partial_event:
            self.done = len(self.choices_finished) >= self.choices_asked
        return self.done

    def end_of_body(self) -> None:
        self.check_deadline()
        if not self.complete_at_end():
            if self.call.http is not None and self.call.http.is_closed:
                raise self._raise(self._client_closed())
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

    def _client_closed(self) -> APIError:
        """The stream's end when ``close()`` cut it: the caller's doing, which tells
        the limit and the breaker nothing (``_core/verdict.py``)."""
        return ClientClosedError(
            f"The client was closed while this stream was read, after {self.delivered} chunks",
            server_load=self.call.server_load,
            request_id=self.info.request_id,
        )

    def _transport_error(self, exc: Exception) -> APIError:
        if self.call.http is not None and self.call.http.is_closed:
            return self._client_closed()
        if isinstance(exc, timeout_errors(TimeoutError)):
            if self.bounds is not None and not isinstance(exc, TimeoutError):
                self.bounds.read_timed_out()  # the transport's read: the idle gap's?
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return self._timed_out(
                # A bare TimeoutError is the async read's bound: the call's deadline.
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
