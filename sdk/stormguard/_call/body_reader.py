"""Reading a response body within ``max_response_bytes`` and the call's deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.exceptions import APIError, APIResponseValidationError
from .._core.http import httpx
from .._io.body import BodyLimit, BodyTooLargeError
from .attempt_record import deadline_error, failed_reading

if TYPE_CHECKING:
    from .call_base import CallBase


__all__ = ["BodyReader"]


class BodyReader:
    """Collects a response body within ``max_response_bytes`` and the call's
    deadline; the drivers feed it the pieces of ``iter_body``/``aiter_body``
    (at most 64 KiB each, however the body is encoded)."""

    __slots__ = ("_call", "_chunks", "_limit", "_status")

    def __init__(self, call: CallBase, response: httpx.Response) -> None:
        self._call = call
        self._chunks: list[bytes] = []
        self._status = response.status_code
        try:
            self._limit = BodyLimit(call.core.max_response_bytes, response)
        except BodyTooLargeError as exc:
            raise self._too_large(exc) from None

    def _too_large(self, exc: BodyTooLargeError) -> APIError:
        return failed_reading(
            self._call,
            APIResponseValidationError(
                str(exc), status_code=self._status, server_load=self._call.server_load
            ),
        )

    def feed(self, chunk: bytes) -> None:
        try:
            self._limit.add(len(chunk))
        except BodyTooLargeError as exc:
            raise self._too_large(exc) from None
        if self._call.deadline.expired:
            raise failed_reading(
                self._call,
                deadline_error(self._call, "while reading the response", response_started=True),
            )
        self._chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self._chunks)
