"""openai-python's ``.with_streaming_response``: the final response, its body unread.

``client.chat.completions.with_streaming_response.create(...)`` is a context
manager whose ``APIResponse`` (``AsyncAPIResponse``) has not read the body: it
is read when asked, once (``read()``, ``text()``, ``json()``, ``iter_bytes()``,
``iter_text()``, ``iter_lines()``, ``parse()``), within ``max_response_bytes``
and the call's deadline, and the response is closed at the end of the block, so
the server sees the disconnect if the body was not read to its end.

The pipeline runs as for any call, and decides what becomes of the body
(``_call/call_result.py``: ``handed_over``, ``result_of_body``,
``failed_after_hand_over``, ``closed_after_hand_over``): the attempt succeeded
at its headers, so nothing is retried once the response is handed over, and an
error reading the body is the call's error. A ``stream=True`` call is read up to
its first event first (a failure before it is retried); ``iter_bytes()`` hands
its bytes on from the first, as they came, and ``parse()`` returns the
``Stream``. The sync and async classes only read bytes; what they read is cut
into chunks, text or lines by one piece of code without I/O (``_Pieces``).

This module holds the context managers and the wrappers that make them. The
responses are ``_client/api_response.py``, the state of the body they share (and
``StreamAlreadyConsumed``) ``_client/handed_over_body.py``, and ``_Pieces``
``_client/body_pieces.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, cast

from .._call.call_result import Delivery
from .api_response import APIResponse as APIResponse
from .api_response import AsyncAPIResponse as AsyncAPIResponse

__all__ = [
    "AsyncResponseContextManager",
    "ResponseContextManager",
    "async_to_streamed_response_wrapper",
    "to_streamed_response_wrapper",
]


P = ParamSpec("P")
R = TypeVar("R")
_ResponseT = TypeVar("_ResponseT", bound="APIResponse[Any]")
_AsyncResponseT = TypeVar("_AsyncResponseT", bound="AsyncAPIResponse[Any]")


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
