"""Reading one stream (``StreamState``): its bytes decoded into chunks for
``Stream`` and ``AsyncStream``, or passed through raw to a caller that decodes them
(transport mode, ``with_streaming_response``), and the call told when the stream
is handed over, ends, fails or is closed.

The bytes come decoded in pieces of at most 64 KiB (``body.iter_body``), each
counted against ``max_response_bytes``, and the deadline is checked before each
piece: a compressed stream of blank lines or of tiny events ends at the cap or
the deadline, however fast it inflates.

A piece's events are read into chunks one at a time, as the caller takes them
(``advance``), not all at once: a piece from a buffering proxy holds hundreds of
events, and hundreds of decoded chunks alive at once (each a handful of dicts and
lists) were most of what the garbage collector walked when many such streams
were read together (docs/benchmarks.md, "Streaming"). So each step of the caller
costs one event's parse, however many events a piece holds; a chunk that arrived
in time is the caller's however long the caller takes to read it, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._core.exceptions import APIError, APIResponseValidationError, StreamInterruptedError
from .._core.http import timeout_errors
from .._io.decoding import parse_json_object
from .._io.sse import EventTooLargeError, ServerSentEvent
from .stream_core import T
from .stream_events import RESPONSE_ENDS, RESPONSE_FAILURES, StreamEvents, is_done, names_error

__all__ = ["StreamState"]

#: No events left to read (shared: never appended to).
_NONE_UNREAD: list[ServerSentEvent] = []
#: A chunk that ends a choice: its ``finish_reason`` is a string, not null.
_FINISHED = re.compile(r'"finish_reason"\s*:\s*"')


class StreamState(StreamEvents[T]):
    """Decoding and bookkeeping shared by both stream classes."""

    def feed(self, raw: bytes) -> None:
        """Decode one piece (at most 64 KiB); past the cap or the deadline, fail."""
        self._count(raw)
        self.check_deadline()
        if not self.in_caller_hands and self.call.spec.replays_stream:
            self.raw_prefix.append(raw)  # replayed to the transport's caller as it came
        try:
            self.unread = self.decoder.feed(raw)
        except EventTooLargeError as exc:
            raise self._raise(
                APIResponseValidationError(
                    str(exc),
                    status_code=self.response.status_code,
                    server_load=self.call.server_load,
                )
            ) from None
        self.advance()

    def advance(self) -> None:
        """Read the events fed and not read yet (``unread``) until a chunk is pending,
        the stream ends, or an event fails it (raised here if no chunk is pending)."""
        events, at = self.unread, self.unread_at
        while at < len(events) and not self.done:
            event = events[at]
            at += 1
            error = self._event(event)
            if error is not None:  # the caller has had every chunk before it
                self.failure = error
                self.done = True
            elif self.pending:
                break
        if at < len(events) and not self.done:
            self.unread_at = at
        else:
            self.unread, self.unread_at = _NONE_UNREAD, 0
        if not self.pending:
            self.raise_failure()

    def raise_failure(self) -> None:
        if self.failure is not None:
            error, self.failure = self.failure, None
            raise self._raise(error)

    def finished(self) -> None:
        """The stream reached ``[DONE]``: settle the call with its usage
        (``stream_options={"include_usage": True}``); without usage the token
        reservation stays spent."""
        self.call.settle(self.usage)
        self.call.ended(response=self.summary())

    def passing_through(self, raw: bytes) -> None:
        """Transport mode: raw bytes go to the caller, who decodes them. They are
        decoded here too, only to learn how the stream ends: at ``[DONE]`` (which
        openai-python closes the response at, before its end), at the end of a body
        once every choice has finished (``complete_at_end``), or with an error
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
            if is_done(event):
                self.done = True
                self.call.ended(response=self.summary())
                return
            data = event.data
            if event.event == "error" or '"error"' in data:  # others skip the parse
                payload = parse_json_object(data)
                if payload is not None and names_error(event, payload):
                    self.done = True
                    self.call.ended(self._error_event(payload), response=self.summary())
                    return
            if _FINISHED.search(data):  # only a chunk that ends a choice is parsed
                payload = parse_json_object(data)
                if payload is not None:
                    self.note_finishes(payload.get("choices"))

    def _passing_response_event(self, event: ServerSentEvent) -> bool:
        """Transport mode, Responses API: whether ``event`` ended the stream (its last
        event, or a failure). Only the events that may end it are parsed; their type
        is in the ``event:`` line, or else in the data."""
        name = event.event
        if name is not None and name not in RESPONSE_ENDS and name not in RESPONSE_FAILURES:
            return False
        if name is None and not any(
            f'"{kind}"' in event.data for kind in (*RESPONSE_ENDS, *RESPONSE_FAILURES)
        ):
            return False
        payload = parse_json_object(event.data)
        if payload is None:
            return False
        error = self._response_event(event, payload)
        self.pending.clear()  # the caller decodes the events; only their end matters here
        if error is None and not self.done:
            return False
        self.done = True
        self.call.ended(error, response=self.summary())
        return True

    def passed_through(self, cut: Exception | None = None) -> APIError | None:
        """Transport mode: the caller read the raw body to its end, or the connection
        failed under it (``cut``); an end the stream is not complete at
        (``complete_at_end``) is a cut stream too. Returns the error the call ended
        with (with its attempts), None when it was complete."""
        if cut is None and self.complete_at_end():
            self.call.ended(self.failure, response=self.summary())
            return None
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
        self.call.annotate(error)
        self.call.ended(error, response=self.summary())
        return error

    def closed_early(self) -> None:
        """The caller closed the stream (or left it): the call ends, as cancelled, if it
        had not ended yet. Before the first chunk a close is the driver's, not the end.
        Either way the server's work on it is over: its concurrency slot is free."""
        self.call.release_slot()
        if self.in_caller_hands:
            self.call.ended(cancelled=True, response=self.summary())

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
        if self.unread and self.call.spec.replays_stream:
            self._read_rest()

    def _read_rest(self) -> None:
        """Read every event fed so far: the raw bytes go on to a caller who decodes
        them (``with_streaming_response``, transport mode), and only how the stream
        ends (``done``, ``failure``) matters here, as it does for the bytes after them."""
        events, at = self.unread, self.unread_at
        self.unread, self.unread_at = _NONE_UNREAD, 0
        for event in events[at:]:
            if self.done:
                break
            error = self._event(event)
            if error is not None:
                self.failure = error
                self.done = True
