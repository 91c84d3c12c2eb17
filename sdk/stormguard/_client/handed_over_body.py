"""A body handed over unread (``.with_streaming_response``): the state the sync and
async ``APIResponse`` share, which way it is read (once only), what was read, and
the call's end; ``StreamAlreadyConsumed`` when it is read a second way."""

from __future__ import annotations

from typing import Any

from .._call.attempt_record import deadline_error
from .._call.body_reader import BodyReader
from .._call.call_result import (
    Delivery,
    closed_after_hand_over,
    failed_after_hand_over,
    result_of_body,
)
from .._core.exceptions import APIError, StormguardError
from .._io.decoding import translate_transport_error

__all__ = ["StreamAlreadyConsumed"]


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
            raise failed_after_hand_over(self.delivery.call, exc) from None

    def transport_failed(self, exc: Exception) -> APIError:
        call = self.delivery.call
        if isinstance(exc, TimeoutError):  # the async read's bound: the call's deadline
            error = deadline_error(call, "while reading the response", response_started=True)
        else:
            error = translate_transport_error(
                exc, response_started=True, server_load=call.server_load
            )
        return failed_after_hand_over(call, error)

    def result(self, body: bytes) -> Any:
        if self.parsed is None:
            self.parsed = result_of_body(self.delivery.call, self.delivery.response, body)
        return self.parsed

    def text(self, body: bytes) -> str:
        return body.decode(self.delivery.response.encoding or "utf-8", errors="replace")

    def close(self) -> None:
        """The caller is done: the call ends (once) with what was read."""
        if not self.ended:
            self.ended = True
            read = self.body if self.body is not None else (b"" if self.whole else None)
            closed_after_hand_over(self.delivery.call, read)
