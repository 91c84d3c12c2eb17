"""stormguard: an OpenAI-compatible client that cannot make an overloaded LLM server worse.

Adaptive concurrency that turns shed load into waiting, retry budgets,
jittered backoff that honours ``Retry-After``, deadlines that cover every
attempt, streams that close the moment they are left, and the server's load
headers on every result and error.
"""

from ._async_client import AsyncClient
from ._base_client import DEFAULT_CONNECTION_LIMITS, DEFAULT_TIMEOUT, NOT_GIVEN, NotGiven
from ._breaker import (
    BreakerConfig,
    BreakerRegistry,
    BreakerState,
    BreakerTransition,
    CircuitBreaker,
    CircuitState,
)
from ._budget import BudgetState, RetryBudget
from ._client import Client
from ._clock import Clock
from ._deadline_transport import DeadlineTransport
from ._discovery import DiscoveryChange, DiscoveryConfig, DiscoveryError, DiscoveryState
from ._ejection import EjectionConfig, EjectionTransition, EndpointHealth, EndpointStatus
from ._endpoints import Endpoint, SpillOver
from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    CircuitOpenError,
    ConflictError,
    ContextWindowExceededError,
    InternalServerError,
    LocalQueueFullError,
    NotFoundError,
    PermissionDeniedError,
    QueueTimeoutError,
    RateLimitError,
    RefusedBeforeSendError,
    ServiceUnavailableError,
    StormguardError,
    StreamInterruptedError,
    ThrottledError,
    TokenRateLimitedError,
    UnprocessableEntityError,
)
from ._history import AttemptRecord
from ._limiter import ConcurrencyLimiter, LimitState
from ._logs import setup_logging
from ._models import (
    CallInfo,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionUsage,
    CreateEmbeddingResponse,
    Embedding,
    EmbeddingUsage,
    Model,
    ModelList,
    Record,
    Response,
    ResponseStreamEvent,
    ResponseUsage,
)
from ._options import Omit, TimeoutLike, omit
from ._rate_limit_headers import RateLimit
from ._raw_response import LegacyAPIResponse
from ._retry import RetryPolicy
from ._stats import CallStats
from ._stream_timeouts import StreamTimeouts
from ._streamed_response import APIResponse, AsyncAPIResponse, StreamAlreadyConsumed
from ._streaming import AsyncStream, Stream
from ._throttle import AdaptiveThrottle
from ._transport import (
    AsyncStormguardTransport,
    StormguardTransport,
    async_httpx_client,
    httpx_client,
    openai_http_library,
)
from ._version import __version__
from .protocol import Priority, ServerLoad, ShedReason
from .telemetry import Telemetry

__all__ = [
    "DEFAULT_CONNECTION_LIMITS",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "APIConnectionError",
    "APIError",
    "APIResponse",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AdaptiveThrottle",
    "AsyncAPIResponse",
    "AsyncClient",
    "AsyncOpenAI",
    "AsyncStormguardTransport",
    "AsyncStream",
    "AttemptRecord",
    "AuthenticationError",
    "BadRequestError",
    "BreakerConfig",
    "BreakerRegistry",
    "BreakerState",
    "BreakerTransition",
    "BudgetState",
    "CallInfo",
    "CallStats",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionMessage",
    "Choice",
    "ChoiceDelta",
    "ChunkChoice",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "Client",
    "Clock",
    "Completion",
    "CompletionChoice",
    "CompletionUsage",
    "ConcurrencyLimiter",
    "ConflictError",
    "ContextWindowExceededError",
    "CreateEmbeddingResponse",
    "DeadlineTransport",
    "DiscoveryChange",
    "DiscoveryConfig",
    "DiscoveryError",
    "DiscoveryState",
    "EjectionConfig",
    "EjectionTransition",
    "Embedding",
    "EmbeddingUsage",
    "Endpoint",
    "EndpointHealth",
    "EndpointStatus",
    "InternalServerError",
    "LegacyAPIResponse",
    "LimitState",
    "LocalQueueFullError",
    "Model",
    "ModelList",
    "NotFoundError",
    "NotGiven",
    "Omit",
    "OpenAI",
    "PermissionDeniedError",
    "Priority",
    "QueueTimeoutError",
    "RateLimit",
    "RateLimitError",
    "Record",
    "RefusedBeforeSendError",
    "Response",
    "ResponseStreamEvent",
    "ResponseUsage",
    "RetryBudget",
    "RetryPolicy",
    "ServerLoad",
    "ServiceUnavailableError",
    "ShedReason",
    "SpillOver",
    "StormguardError",
    "StormguardTransport",
    "Stream",
    "StreamAlreadyConsumed",
    "StreamInterruptedError",
    "StreamTimeouts",
    "Telemetry",
    "ThrottledError",
    "TimeoutLike",
    "TokenRateLimitedError",
    "UnprocessableEntityError",
    "__version__",
    "async_httpx_client",
    "httpx_client",
    "omit",
    "openai_http_library",
]

#: openai-python's class names, so that ``from openai import OpenAI`` and ``openai.OpenAI(...)``
#: port by changing only the import (``from stormguard import OpenAI``, ``import stormguard as
#: openai``); the same classes as ``Client`` and ``AsyncClient``.
OpenAI = Client
AsyncOpenAI = AsyncClient

setup_logging()
