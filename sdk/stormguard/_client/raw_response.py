"""openai-python's ``.with_raw_response``: the final response beside the result.

``client.chat.completions.with_raw_response.create(...)`` returns a
``LegacyAPIResponse`` (openai-python 3.x returns this class there, under this
name): the final attempt's response, its body read unless it is a stream, with
openai's names (``headers``, ``status_code``, ``url``, ``method``,
``http_request``, ``http_response``, ``http_version``, ``elapsed``,
``is_closed``, ``request_id``, ``retries_taken``, ``content``, ``text``) and
``parse()`` for the result. ``with_streaming_response`` (``_client/streamed_response.py``)
shares what every such response says of the call.

The whole pipeline runs first (pre-check, limiter, breaker, retries, fallback
models): what is handed over is the final attempt's response, and an error
status is raised as stormguard's error before anything is handed over, as
openai-python raises its own. The differences from openai's object:

* the result is parsed when the call completes, so a body that is not what the
  API promises is an ``APIResponseValidationError`` of the call, not of a later
  ``parse()``; ``parse()`` takes no ``to=``;
* a ``stream=True`` call's stream has been read up to its first event (a
  failure before it is retried); ``parse()`` returns the ``Stream``;
* ``retries_taken`` counts every attempt after the first, requeues and
  failovers included; ``attempt_history``, ``server_load``, ``rate_limit`` and
  ``call_info`` are stormguard's own, as on results.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar, cast

from .._call.call_result import Delivery
from .._core.http import httpx

if TYPE_CHECKING:
    from .._core.history import AttemptRecord
    from .._core.rate_limit_headers import RateLimit
    from .._core.results import CallInfo
    from ..protocol import ServerLoad

__all__ = ["LegacyAPIResponse", "async_to_raw_response_wrapper", "to_raw_response_wrapper"]

P = ParamSpec("P")
R = TypeVar("R")


class _ResponseBase(Generic[R]):
    """What every raw or streamed response says of the final attempt and the call."""

    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery

    @property
    def http_response(self) -> httpx.Response:
        """The final attempt's httpx response."""
        return self._delivery.response

    @property
    def headers(self) -> httpx.Headers:
        return self._delivery.response.headers

    @property
    def http_request(self) -> httpx.Request:
        """The request of the final attempt."""
        return self._delivery.response.request

    @property
    def status_code(self) -> int:
        return self._delivery.response.status_code

    @property
    def url(self) -> httpx.URL:
        return self._delivery.response.request.url

    @property
    def method(self) -> str:
        return self._delivery.response.request.method

    @property
    def http_version(self) -> str:
        return self._delivery.response.http_version

    @property
    def elapsed(self) -> datetime.timedelta:
        """The final attempt's time from sending to the end of its body (httpx's
        ``RuntimeError`` while the body is still open)."""
        elapsed = self._delivery.elapsed
        return elapsed if elapsed is not None else self._delivery.response.elapsed

    @property
    def is_closed(self) -> bool:
        return self._delivery.response.is_closed

    @property
    def request_id(self) -> str | None:
        """The server's ``x-request-id``."""
        return self._delivery.info.request_id

    @property
    def retries_taken(self) -> int:
        """Attempts after the first (retries, requeues, failovers); 0 with one attempt."""
        return max(0, len(self._delivery.info.attempt_history) - 1)

    @property
    def call_info(self) -> CallInfo:
        """Attempts, load headers and request id of the call, as on results."""
        return self._delivery.info

    @property
    def attempt_history(self) -> tuple[AttemptRecord, ...]:
        """Every HTTP attempt of the call, in order; the last one is this response's."""
        return self._delivery.info.attempt_history

    @property
    def server_load(self) -> ServerLoad:
        """The load headers of this response."""
        return self._delivery.info.server_load

    @property
    def rate_limit(self) -> RateLimit:
        """The ``x-ratelimit-*`` headers of this response."""
        return self._delivery.info.rate_limit

    def __repr__(self) -> str:
        response = self._delivery.response
        return f"<{type(self).__name__} [{response.status_code} {response.reason_phrase}]>"


class LegacyAPIResponse(_ResponseBase[R]):
    """What ``.with_raw_response`` returns (sync and async): the final response, its
    body read unless it is a stream, and ``parse()`` for the result."""

    def parse(self) -> R:
        """The result (``ChatCompletion`` ...), or the ``Stream``/``AsyncStream`` of a
        ``stream=True`` call."""
        return cast(R, self._delivery.result)

    @property
    def content(self) -> bytes:
        """The body (httpx's ``ResponseNotRead`` for a stream)."""
        return self._delivery.response.content

    @property
    def text(self) -> str:
        return self._delivery.response.text


def to_raw_response_wrapper(func: Callable[P, R]) -> Callable[P, LegacyAPIResponse[R]]:
    """``func`` (a resource method bound in "response" hand-over mode) returning a
    ``LegacyAPIResponse`` of its result."""

    @functools.wraps(func)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> LegacyAPIResponse[R]:
        return LegacyAPIResponse(cast(Delivery, func(*args, **kwargs)))

    return wrapped


def async_to_raw_response_wrapper(
    func: Callable[P, Awaitable[R]],
) -> Callable[P, Awaitable[LegacyAPIResponse[R]]]:
    """The async twin of ``to_raw_response_wrapper``."""

    @functools.wraps(func)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> LegacyAPIResponse[R]:
        return LegacyAPIResponse(cast(Delivery, await func(*args, **kwargs)))

    return wrapped
