"""Server-sent events, decoded incrementally from raw bytes.

Hand-written because the decoder must do three things the common SSE helpers
(httpx-sse, openai-python's decoder) leave to the caller: bound the memory of
one event (a server that never sends a newline must not grow a buffer without
end), tell a clean end of stream from one cut off in the middle of an event,
and handle CR, LF and CRLF line ends split across network chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "EventTooLargeError", "SSEDecoder", "ServerSentEvent"]

DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event (the fields of the SSE spec that OpenAI-style APIs use)."""

    data: str
    event: str | None = None
    id: str | None = None


class EventTooLargeError(ValueError):
    """One event grew past the decoder's limit."""


class SSEDecoder:
    """Feed it byte chunks, get complete events back.

    >>> d = SSEDecoder()
    >>> events = d.feed(b"data: a\\r\\ndata: b\\r\\n\\r\\n: comment\\n\\ndata: [DONE]\\n\\n")
    >>> [e.data for e in events]
    ['a\\nb', '[DONE]']
    """

    __slots__ = ("_buffer", "_data", "_event", "_id", "_max_bytes", "_pending_bytes", "_skip_lf")

    def __init__(self, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max_bytes = max_event_bytes
        self._buffer = bytearray()
        self._skip_lf = False  # the last chunk ended in CR: a leading LF belongs to it
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._pending_bytes = 0

    @property
    def has_partial_event(self) -> bool:
        """True when bytes of an event arrived that no blank line has dispatched yet."""
        return bool(self._buffer) or bool(self._data) or self._event is not None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode ``chunk`` and return the events it completed, in order."""
        events: list[ServerSentEvent] = []
        if not chunk:
            return events
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        buffer = self._buffer
        buffer += chunk
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find(b"\r", start)
            lf = buffer.find(b"\n", start)
            if cr == -1 and lf == -1:
                break
            if cr == -1 or (lf != -1 and lf < cr):
                end, nxt = lf, lf + 1
            elif cr + 1 < length:
                end, nxt = cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
            else:  # CR at the very end: an LF may follow in the next chunk
                end, nxt = cr, cr + 1
                self._skip_lf = True
            event = self._line(bytes(buffer[start:end]))
            if event is not None:
                events.append(event)
            start = nxt
        del buffer[:start]
        if len(buffer) + self._pending_bytes > self._max_bytes:
            raise EventTooLargeError(f"a server-sent event exceeded {self._max_bytes} bytes")
        return events

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        if not raw:
            return self._dispatch()
        self._pending_bytes += len(raw)
        if self._pending_bytes > self._max_bytes:
            raise EventTooLargeError(f"a server-sent event exceeded {self._max_bytes} bytes")
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return None  # comment (keep-alive)
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        # "retry" and unknown fields are ignored, as the spec says.
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event, id_ = self._data, self._event, self._id
        self._data, self._event, self._pending_bytes = [], None, 0
        if not data:
            return None
        return ServerSentEvent(data="\n".join(data), event=event, id=id_)
