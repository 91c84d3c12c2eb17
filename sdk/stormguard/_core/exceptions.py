"""The stormguard exception tree.

Names and attributes follow openai-python so that ``except RateLimitError`` and
``err.code`` port unchanged::

    StormguardError
    ├── APIError                        the server or the network said no
    │   ├── APIConnectionError          no usable response (refused, reset, DNS)
    │   │   ├── APITimeoutError         the deadline or an httpx timeout ran out
    │   │   │   └── QueueTimeoutError   no concurrency slot before the deadline
    │   │   ├── ClientClosedError       the client was closed (close() ended the call)
    │   │   └── EventLoopMismatchError  your http_client's connection is another loop's
    │   ├── APIResponseValidationError  a response that is not what the API promises
    │   ├── StreamInterruptedError      a stream cut off before its end
    │   └── APIStatusError              a 4xx/5xx answer (``status_code``)
    │       ├── BadRequestError              400
    │       │   └── ContextWindowExceededError  prompt + max_tokens cannot fit (refused here)
    │       ├── AuthenticationError          401
    │       ├── PermissionDeniedError        403
    │       ├── NotFoundError                404
    │       ├── ConflictError                409
    │       ├── UnprocessableEntityError     422
    │       ├── RateLimitError               429
    │       └── InternalServerError          5xx
    │           └── ServiceUnavailableError  503
    └── RefusedBeforeSendError          stopped in this process, no I/O happened
        ├── ContextWindowExceededError  (also a BadRequestError, as LiteLLM's is)
        ├── TokenRateLimitedError       the client-side token rate limit said wait too long
        ├── QuotaWaitError              the key's quota cannot take the call before its deadline
        ├── CircuitOpenError            the endpoint's breaker is open
        ├── ThrottledError              adaptive throttling refused it locally
        └── LocalQueueFullError         too many calls already wait for a slot

Every ``APIError`` has openai-python's attributes with openai-python's meaning:
``message``; ``request``, the ``httpx.Request`` of the attempt the error is about
(None when no request went out for it: a local queue timeout, a deadline that
passed before the attempt started); ``body``, the ``error`` object of an
OpenAI-shaped JSON body (the whole JSON when it has none, the text when it is
not JSON, None without a body); ``code``, ``param`` and ``type`` read from that
object (``code`` as a string, vLLM's numeric codes included; LiteLLM's proxy
writes ``"None"`` for an absent value, read as None); ``request_id`` from
``x-request-id``. ``APIStatusError`` adds ``status_code`` and ``response``.
``ContextWindowExceededError`` is a ``BadRequestError`` with ``status_code``
400, ``code="context_length_exceeded"`` and ``request``/``response`` None:
nothing was sent. The other local refusals are not ``APIError`` s and have none
of these. The constructors differ from openai's (message first, keywords), and
the classes are stormguard's own: ``except openai.APIError`` does not catch them,
unless the client was built with ``openai_errors=True`` (``stormguard.openai_errors``
then raises each as a class that is also openai's).

Every error also carries ``server_load`` (parsed load headers, all None when
there was no response), ``rate_limit`` (its ``x-ratelimit-*`` headers),
``attempts``, ``attempt_history`` and ``retry_stopped_by``. No message, repr or
string attribute (``code``, ``param``, ``type`` and a text ``body`` included)
ever contains a credential the client sends (``api_key``, credential headers, a
password in the base URL): every text that came from the server, or from a
library quoting it, is scrubbed (``redact.Redactor``) before it is cut, and
requests (with their headers) are never part of a message. ``request``,
``response`` and ``APIStatusError.raw_body`` are what was sent and what came
back, credentials and echoes included: they are not for logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..protocol import ServerLoad
from .rate_limit_headers import RateLimit
from .stop_reason import StopReason

if TYPE_CHECKING:
    from .history import AttemptRecord
    from .http import httpx
    from .precheck import Precheck

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "CircuitOpenError",
    "ClientClosedError",
    "ConflictError",
    "ContextWindowExceededError",
    "EventLoopMismatchError",
    "InternalServerError",
    "LocalQueueFullError",
    "NotFoundError",
    "PermissionDeniedError",
    "QueueTimeoutError",
    "QuotaWaitError",
    "RateLimitError",
    "RefusedBeforeSendError",
    "ServiceUnavailableError",
    "StormguardError",
    "StreamInterruptedError",
    "ThrottledError",
    "TokenRateLimitedError",
    "UnprocessableEntityError",
    "error_object",
    "status_error_class",
]

_EMPTY_LOAD = ServerLoad()
_NO_RATE_LIMIT = RateLimit()
#: ``code``, ``param`` and ``type`` longer than this are cut (they name things).
_MAX_FIELD = 200
#: What LiteLLM's proxy (``str(None)``) and some gateways write for "no value".
_ABSENT = frozenset({"", "none", "null"})


def error_object(payload: object) -> object:
    """The part of an error body that openai-python calls ``body``: the ``error``
    object of ``{"error": {...}}``, else the body itself (vLLM's flat
    ``{"object": "error", "message", "type", "code"}``, FastAPI's ``{"detail"}``)."""
    if isinstance(payload, Mapping) and "error" in payload:
        return payload["error"]
    return payload


def _field(value: object) -> str | None:
    """One of ``code``/``param``/``type``: a string or a whole number, as a string."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()[:_MAX_FIELD]
    return None if text.lower() in _ABSENT else text


def _error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """``code``, ``param`` and ``type`` of an error object (None when not a mapping)."""
    if not isinstance(body, Mapping):
        return None, None, None
    return _field(body.get("code")), _field(body.get("param")), _field(body.get("type"))


class StormguardError(Exception):
    """Root of every error stormguard raises."""

    message: str
    server_load: ServerLoad
    #: The ``x-ratelimit-*`` headers of the last response (all None without one).
    rate_limit: RateLimit
    #: Number of HTTP attempts the logical call made (0 when refused before I/O).
    attempts: int
    attempt_history: tuple[AttemptRecord, ...]
    #: Why the retry loop stopped (``StopReason``, equal to its string value:
    #: ``"budget"``, ``"deadline"``, ...); None when no retry decision was taken
    #: (refused before the retry loop, by the token pre-check).
    retry_stopped_by: StopReason | None
    #: The call's token pre-check when one ran and passed (counter name, counts).
    precheck: Precheck | None

    def __init__(self, message: str, *, server_load: ServerLoad | None = None) -> None:
        # Exception's own __init__, not super()'s: a class that is also another
        # library's error (``stormguard.openai_errors``) must not pass ``message`` on to
        # that library's constructor, whose signature differs.
        Exception.__init__(self, message)
        self.message = message
        self.server_load = server_load if server_load is not None else _EMPTY_LOAD
        self.rate_limit = _NO_RATE_LIMIT
        self.attempts = 0
        self.attempt_history = ()
        self.retry_stopped_by = None
        self.precheck = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class APIError(StormguardError):
    """An error that came from talking to the server."""

    #: The request of the attempt this error is about (None: none went out for it).
    request: httpx.Request | None
    #: The error object of the response body (see the module docstring), scrubbed.
    body: object
    #: The error object's ``code`` (``"insufficient_quota"``, vLLM's ``"400"``).
    code: str | None
    #: The error object's ``param`` (the request field at fault).
    param: str | None
    #: The error object's ``type`` (``"invalid_request_error"``).
    type: str | None
    #: The response's ``x-request-id``, scrubbed, at most 200 characters.
    request_id: str | None

    def __init__(
        self,
        message: str,
        request: httpx.Request | None = None,
        *,
        body: object = None,
        server_load: ServerLoad | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, server_load=server_load)
        self.request = request
        self.body = body
        self.code, self.param, self.type = _error_fields(body)
        self.request_id = request_id


class APIConnectionError(APIError):
    """The request got no usable response: refused, reset, unreachable."""


class APITimeoutError(APIConnectionError):
    """The call's deadline, or an httpx timeout, ran out."""

    #: True when part of the response had arrived: the server did the work, and a
    #: retry would do it again.
    response_started: bool

    def __init__(
        self,
        message: str,
        request: httpx.Request | None = None,
        *,
        response_started: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, request, **kwargs)
        self.response_started = response_started


class QueueTimeoutError(APITimeoutError):
    """The call could not get a concurrency slot before its deadline: it waited
    ``queued_s`` in the local queue, and was failed as soon as the measured rate at
    which slots free up showed the wait ahead (``estimated_wait_s``; None when the
    deadline itself passed) would not fit. Nothing was sent for this attempt, so
    ``retry_stopped_by`` is ``"deadline"``."""

    #: Seconds the call waited in the local queue.
    queued_s: float
    #: The wait still ahead when it was failed early (None: the deadline passed).
    estimated_wait_s: float | None

    def __init__(
        self, message: str, *, queued_s: float, estimated_wait_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.queued_s = queued_s
        self.estimated_wait_s = estimated_wait_s


class ClientClosedError(APIConnectionError):
    """The client was closed: ``close()`` ended this call while it was in flight, or
    the call began after it (on this client, a ``with_options`` copy of the client
    that owns the pool, or your ``http_client`` once you closed it). The caller's
    doing, not the server's: never retried (``retry_stopped_by="cancelled"``), and
    no failure for the breaker, the throttle or the concurrency limit. An
    ``APIConnectionError``, as openai-python 1.x raises for a closed client (it
    wraps any error of a send in one)."""

    def __init__(
        self,
        message: str = "The client is closed: make a new one (a closed client's"
        " connection pool cannot be opened again)",
        request: httpx.Request | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, request, **kwargs)


class EventLoopMismatchError(APIConnectionError):
    """The ``http_client`` you passed to an ``AsyncClient`` holds a connection opened
    on another event loop, one that has closed or that runs in another thread
    (asyncio's ``RuntimeError``, in the message): an httpx ``AsyncClient`` serves
    the loop its connections were opened on. Make one per event loop, or pass
    none: the client's own pool keeps one per loop. Not retried, and no failure
    for the breaker, the throttle or the concurrency limit."""


class APIResponseValidationError(APIError):
    """The server answered 2xx with a body the API does not allow (bad JSON, wrong type)."""

    status_code: int
    response: httpx.Response | None

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        response: httpx.Response | None = None,
        **kwargs: Any,
    ) -> None:
        if response is not None and kwargs.get("request") is None:
            kwargs["request"] = _request_of(response)
        super().__init__(message, **kwargs)
        self.status_code = status_code
        self.response = response


class StreamInterruptedError(APIError):
    """A streamed response ended before its end marker (connection cut mid-event)."""

    #: Chunks that had reached the caller before the cut.
    chunks_received: int

    def __init__(self, message: str, *, chunks_received: int = 0, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.chunks_received = chunks_received


class APIStatusError(APIError):
    """The server answered with a 4xx or 5xx status."""

    status_code: int
    #: The ``error`` object of the decoded JSON body (the whole JSON when it has
    #: none), or the start of the text when it was not JSON (500 characters);
    #: credentials the server echoed are ``[redacted]`` in both.
    body: object
    #: The body as it came, unscrubbed (None for errors sent inside a stream).
    raw_body: bytes | None
    #: The response (None for a refusal made in this process).
    response: httpx.Response | None

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        body: object = None,
        raw_body: bytes | None = None,
        response: httpx.Response | None = None,
        request: httpx.Request | None = None,
        server_load: ServerLoad | None = None,
        request_id: str | None = None,
    ) -> None:
        if request is None and response is not None:
            request = _request_of(response)
        super().__init__(
            message, request, body=body, server_load=server_load, request_id=request_id
        )
        self.status_code = status_code
        self.raw_body = raw_body
        self.response = response

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status_code={self.status_code}, {self.message!r})"


class BadRequestError(APIStatusError):
    """400: the request can never succeed as sent."""


class AuthenticationError(APIStatusError):
    """401: missing or wrong API key."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: no such model or route."""


class ConflictError(APIStatusError):
    """409."""


class UnprocessableEntityError(APIStatusError):
    """422: the body is well-formed but its values are not accepted."""


class RateLimitError(APIStatusError):
    """429: this caller is over its rate."""


class InternalServerError(APIStatusError):
    """5xx: the server failed."""


class ServiceUnavailableError(InternalServerError):
    """503: overloaded, warming up, restarting or draining (see ``server_load.load_shed``)."""


class RefusedBeforeSendError(StormguardError):
    """The call was refused inside this process; nothing was sent."""


class ContextWindowExceededError(BadRequestError, RefusedBeforeSendError, ValueError):
    """Prompt tokens plus ``max_tokens`` exceed the model's context window.

    Found in this process, before anything was sent; it reads as the 400 the
    server would have answered (OpenAI's ``code="context_length_exceeded"``), so
    ``except BadRequestError`` catches it as it catches LiteLLM's. It is the
    caller's error: never retried, never a breaker or throttle failure, and
    ``request``/``response`` are None."""

    def __init__(
        self,
        message: str,
        *,
        model: str,
        prompt_tokens: int,
        max_tokens: int,
        context_window: int,
        counter: str,
    ) -> None:
        body = {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
        super().__init__(message, status_code=400, body=body)
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_window = context_window
        self.counter = counter


class TokenRateLimitedError(RefusedBeforeSendError):
    """The client-side token rate limit would make the call wait past its deadline."""

    def __init__(self, message: str, *, tokens: int, wait: float) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.wait = wait


class QuotaWaitError(RefusedBeforeSendError):
    """The quota of the call's API key (and model) cannot take the call before its
    deadline: even the whole key's rate, not only this process's share of it, would
    need ``least_wait`` seconds more than the call has left (``remaining``), or too
    many calls already wait for the key. ``wait`` is when it would have fitted at
    this process's share (None: not estimated). Nothing was sent for this attempt;
    ``retry_stopped_by`` is ``"deadline"``. ``key`` is the key's fingerprint (the
    first 12 hex digits of its SHA-256, as the reference server labels keys), never
    the key."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        model: str,
        wait: float | None,
        least_wait: float,
        remaining: float,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.model = model
        self.wait = wait
        self.least_wait = least_wait
        self.remaining = remaining


class CircuitOpenError(RefusedBeforeSendError):
    """The breaker of the endpoint (and model) is open: failing fast, no I/O."""

    def __init__(self, message: str, *, breaker: str, retry_in: float | None = None) -> None:
        super().__init__(message)
        self.breaker = breaker
        self.retry_in = retry_in


class ThrottledError(RefusedBeforeSendError):
    """Adaptive throttling refused the request locally: the server has been refusing
    most recent requests, so this one was not sent (``probability`` it was refused at)."""

    def __init__(self, message: str, *, probability: float) -> None:
        super().__init__(message)
        self.probability = probability


class LocalQueueFullError(RefusedBeforeSendError):
    """The endpoint's local queue already holds ``max_waiting`` calls waiting for a
    concurrency slot: this one is refused now rather than queued without bound."""

    def __init__(self, message: str, *, endpoint: str, waiting: int) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.waiting = waiting


def _request_of(response: httpx.Response) -> httpx.Request | None:
    """The request a response answers (None for a response built without one)."""
    try:
        return response.request
    except RuntimeError:  # httpx: "The request instance has not been set"
        return None


_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The exception class for an HTTP error status."""
    cls = _STATUS_CLASSES.get(status_code)
    if cls is not None:
        return cls
    if status_code >= 500:
        return InternalServerError
    return APIStatusError
