"""stormguard: an OpenAI-compatible client that cannot make an overloaded LLM server worse.

Adaptive concurrency that turns shed load into waiting, retry budgets,
jittered backoff that honours ``Retry-After``, deadlines that cover every
attempt, streams that close the moment they are left, and the server's load
headers on every result and error.

Every public name loads its module on first use (PEP 562): ``import stormguard``
costs little more than ``import httpx`` (bench/bench_import.py), and a program
pays for the client when it first names it; optional pieces (tiktoken, the
OpenTelemetry API, httpcore) wait until a call needs them. ``from stormguard
import Client`` and type checkers see the same names as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import TYPE_CHECKING, Any

from ._core.logs import setup_logging
from ._version import __version__

if TYPE_CHECKING:
    from ._call.client_core import DEFAULT_TIMEOUT
    from ._call.openai_conventions import NOT_GIVEN, NotGiven, Omit, TimeoutLike, omit
    from ._call.stats import CallStats
    from ._call.stream_timeouts import StreamTimeouts
    from ._call.streaming import AsyncStream, Stream
    from ._client.api_response import APIResponse, AsyncAPIResponse
    from ._client.async_client import AsyncClient
    from ._client.base_client import DEFAULT_CONNECTION_LIMITS
    from ._client.call_info_lookup import call_info
    from ._client.client import Client
    from ._client.handed_over_body import StreamAlreadyConsumed
    from ._client.raw_response import LegacyAPIResponse
    from ._core.clock import Clock
    from ._core.exceptions import (
        APIConnectionError,
        APIError,
        APIResponseValidationError,
        APIStatusError,
        APITimeoutError,
        AuthenticationError,
        BadRequestError,
        CircuitOpenError,
        ClientClosedError,
        ConflictError,
        ContextWindowExceededError,
        EventLoopMismatchError,
        InternalServerError,
        LocalQueueFullError,
        NotFoundError,
        PermissionDeniedError,
        QueueTimeoutError,
        QuotaWaitError,
        RateLimitError,
        RefusedBeforeSendError,
        ServiceUnavailableError,
        StormguardError,
        StreamInterruptedError,
        ThrottledError,
        TokenRateLimitedError,
        UnprocessableEntityError,
    )
    from ._core.history import AttemptRecord, FallbackKind, FallbackStep
    from ._core.rate_limit_headers import RateLimit
    from ._core.results import (
        CALL_INFO_EXTENSION,
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
    from ._core.stop_reason import StopReason
    from ._io.deadline_transport import DeadlineTransport
    from ._policies.breaker.circuit import CircuitBreaker
    from ._policies.breaker.config import BreakerConfig
    from ._policies.breaker.registry import BreakerRegistry
    from ._policies.breaker.states import BreakerSnapshot, BreakerTransition, CircuitState
    from ._policies.fallback import Fallbacks
    from ._policies.hedge.policy import HedgePolicy
    from ._policies.limiter.endpoint_limit import LimitSnapshot
    from ._policies.limiter.limiter import ConcurrencyLimiter
    from ._policies.quota import QuotaPolicy, QuotaSnapshot
    from ._policies.retry.budget import BudgetSnapshot, RetryBudget
    from ._policies.retry.retry import RetryPolicy
    from ._policies.retry.throttle import AdaptiveThrottle
    from ._policies.routing.affinity_config import AffinityPolicy
    from ._policies.routing.deployment import Deployment, Pin
    from ._policies.routing.discovery import DiscoveryError
    from ._policies.routing.discovery_config import DiscoveryConfig
    from ._policies.routing.dns_name import DiscoveryChange, DiscoverySnapshot
    from ._policies.routing.ejection_config import EjectionConfig
    from ._policies.routing.ejection_status import (
        EjectionTransition,
        EndpointHealth,
        EndpointStatus,
    )
    from ._policies.routing.endpoint_config import Endpoint, SpillOver
    from ._policies.routing.latency_config import LatencyRouting
    from ._policies.routing.tiers import DeploymentSnapshot
    from ._transport.clients import async_httpx_client, httpx_client, openai_http_library
    from ._transport.transport import AsyncStormguardTransport, StormguardTransport
    from .protocol import Priority, ServerLoad, ShedReason
    from .telemetry import Telemetry

__all__ = [
    "CALL_INFO_EXTENSION",
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
    "AffinityPolicy",
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
    "BreakerSnapshot",
    "BreakerTransition",
    "BudgetSnapshot",
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
    "ClientClosedError",
    "Clock",
    "Completion",
    "CompletionChoice",
    "CompletionUsage",
    "ConcurrencyLimiter",
    "ConflictError",
    "ContextWindowExceededError",
    "CreateEmbeddingResponse",
    "DeadlineTransport",
    "Deployment",
    "DeploymentSnapshot",
    "DiscoveryChange",
    "DiscoveryConfig",
    "DiscoveryError",
    "DiscoverySnapshot",
    "EjectionConfig",
    "EjectionTransition",
    "Embedding",
    "EmbeddingUsage",
    "Endpoint",
    "EndpointHealth",
    "EndpointStatus",
    "EventLoopMismatchError",
    "FallbackKind",
    "FallbackStep",
    "Fallbacks",
    "HedgePolicy",
    "InternalServerError",
    "LatencyRouting",
    "LegacyAPIResponse",
    "LimitSnapshot",
    "LocalQueueFullError",
    "Model",
    "ModelList",
    "NotFoundError",
    "NotGiven",
    "Omit",
    "OpenAI",
    "OpenAIError",
    "PermissionDeniedError",
    "Pin",
    "Priority",
    "QueueTimeoutError",
    "QuotaPolicy",
    "QuotaSnapshot",
    "QuotaWaitError",
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
    "StopReason",
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
    "call_info",
    "httpx_client",
    "omit",
    "openai_http_library",
]

#: Public name -> the module it is imported from when the name is first used: the
#: module that defines it or, for a package whose modules are private
#: (``_policies/quota/``, ``telemetry/``), the package, which re-exports it.
_MODULES: dict[str, str] = {
    "AsyncClient": "._client.async_client",
    "DEFAULT_CONNECTION_LIMITS": "._client.base_client",
    "DEFAULT_TIMEOUT": "._call.client_core",
    "NOT_GIVEN": "._call.openai_conventions",
    "NotGiven": "._call.openai_conventions",
    "BreakerConfig": "._policies.breaker.config",
    "BreakerRegistry": "._policies.breaker.registry",
    "BreakerSnapshot": "._policies.breaker.states",
    "BreakerTransition": "._policies.breaker.states",
    "CircuitBreaker": "._policies.breaker.circuit",
    "CircuitState": "._policies.breaker.states",
    "BudgetSnapshot": "._policies.retry.budget",
    "RetryBudget": "._policies.retry.budget",
    "Client": "._client.client",
    "Clock": "._core.clock",
    "DeadlineTransport": "._io.deadline_transport",
    "AffinityPolicy": "._policies.routing.affinity_config",
    "HedgePolicy": "._policies.hedge.policy",
    "LatencyRouting": "._policies.routing.latency_config",
    "Deployment": "._policies.routing.deployment",
    "Pin": "._policies.routing.deployment",
    "DeploymentSnapshot": "._policies.routing.tiers",
    "DiscoveryChange": "._policies.routing.dns_name",
    "DiscoveryConfig": "._policies.routing.discovery_config",
    "DiscoveryError": "._policies.routing.discovery",
    "DiscoverySnapshot": "._policies.routing.dns_name",
    "EjectionConfig": "._policies.routing.ejection_config",
    "EjectionTransition": "._policies.routing.ejection_status",
    "EndpointHealth": "._policies.routing.ejection_status",
    "EndpointStatus": "._policies.routing.ejection_status",
    "Endpoint": "._policies.routing.endpoint_config",
    "SpillOver": "._policies.routing.endpoint_config",
    "FallbackKind": "._core.history",
    "FallbackStep": "._core.history",
    "Fallbacks": "._policies.fallback",
    "APIConnectionError": "._core.exceptions",
    "APIError": "._core.exceptions",
    "APIResponseValidationError": "._core.exceptions",
    "APIStatusError": "._core.exceptions",
    "APITimeoutError": "._core.exceptions",
    "AuthenticationError": "._core.exceptions",
    "BadRequestError": "._core.exceptions",
    "CircuitOpenError": "._core.exceptions",
    "ClientClosedError": "._core.exceptions",
    "ConflictError": "._core.exceptions",
    "ContextWindowExceededError": "._core.exceptions",
    "EventLoopMismatchError": "._core.exceptions",
    "InternalServerError": "._core.exceptions",
    "LocalQueueFullError": "._core.exceptions",
    "NotFoundError": "._core.exceptions",
    "PermissionDeniedError": "._core.exceptions",
    "QueueTimeoutError": "._core.exceptions",
    "QuotaWaitError": "._core.exceptions",
    "RateLimitError": "._core.exceptions",
    "RefusedBeforeSendError": "._core.exceptions",
    "ServiceUnavailableError": "._core.exceptions",
    "StormguardError": "._core.exceptions",
    "StreamInterruptedError": "._core.exceptions",
    "ThrottledError": "._core.exceptions",
    "TokenRateLimitedError": "._core.exceptions",
    "UnprocessableEntityError": "._core.exceptions",
    "AttemptRecord": "._core.history",
    "ConcurrencyLimiter": "._policies.limiter.limiter",
    "LimitSnapshot": "._policies.limiter.endpoint_limit",
    "CALL_INFO_EXTENSION": "._core.results",
    "CallInfo": "._core.results",
    "ChatCompletion": "._core.results",
    "ChatCompletionChunk": "._core.results",
    "ChatCompletionMessage": "._core.results",
    "Choice": "._core.results",
    "ChoiceDelta": "._core.results",
    "ChunkChoice": "._core.results",
    "Completion": "._core.results",
    "CompletionChoice": "._core.results",
    "CompletionUsage": "._core.results",
    "CreateEmbeddingResponse": "._core.results",
    "Embedding": "._core.results",
    "EmbeddingUsage": "._core.results",
    "Model": "._core.results",
    "ModelList": "._core.results",
    "Record": "._core.results",
    "Response": "._core.results",
    "ResponseStreamEvent": "._core.results",
    "ResponseUsage": "._core.results",
    "Omit": "._call.openai_conventions",
    "TimeoutLike": "._call.openai_conventions",
    "omit": "._call.openai_conventions",
    "QuotaPolicy": "._policies.quota",
    "QuotaSnapshot": "._policies.quota",
    "RateLimit": "._core.rate_limit_headers",
    "LegacyAPIResponse": "._client.raw_response",
    "RetryPolicy": "._policies.retry.retry",
    "CallStats": "._call.stats",
    "StreamTimeouts": "._call.stream_timeouts",
    "APIResponse": "._client.api_response",
    "AsyncAPIResponse": "._client.api_response",
    "StreamAlreadyConsumed": "._client.handed_over_body",
    "AsyncStream": "._call.streaming",
    "Stream": "._call.streaming",
    "AdaptiveThrottle": "._policies.retry.throttle",
    "AsyncStormguardTransport": "._transport.transport",
    "StormguardTransport": "._transport.transport",
    "async_httpx_client": "._transport.clients",
    "httpx_client": "._transport.clients",
    "openai_http_library": "._transport.clients",
    "Priority": ".protocol",
    "ServerLoad": ".protocol",
    "ShedReason": ".protocol",
    "StopReason": "._core.stop_reason",
    "Telemetry": ".telemetry",
    "call_info": "._client.call_info_lookup",
}

#: openai-python's client names, so that ``from openai import OpenAI`` and
#: ``openai.OpenAI(...)`` port by changing only the import (``from stormguard import
#: OpenAI``, ``import stormguard as openai``). Where openai-python is installed they are
#: openai's own clients over stormguard's pipeline (``_transport/openai_client.py``: what frameworks
#: check with ``isinstance``), and ``OpenAIError`` openai's base of every error they
#: raise; without it, ``Client``, ``AsyncClient`` and ``StormguardError``.
_OPENAI_NAMES = {"OpenAI": "Client", "AsyncOpenAI": "AsyncClient", "OpenAIError": "StormguardError"}

if TYPE_CHECKING:
    from ._transport.openai_client import AsyncOpenAI, OpenAI, OpenAIError

#: Old names of the frozen copies that ``.state()`` and ``.stats()`` return: ``*State``
#: now names live state only (and enums of named states, like ``CircuitState``). Each
#: still works and warns with the new name; none is in ``__all__``.
_DEPRECATED = {
    "BreakerState": "BreakerSnapshot",
    "BudgetState": "BudgetSnapshot",
    "DiscoveryState": "DiscoverySnapshot",
    "LimitState": "LimitSnapshot",
}

if TYPE_CHECKING:
    BreakerState = BreakerSnapshot
    BudgetState = BudgetSnapshot
    DiscoveryState = DiscoverySnapshot
    LimitState = LimitSnapshot


def __getattr__(name: str) -> Any:
    new = _DEPRECATED.get(name)
    if new is not None:  # not cached in globals(): every use warns
        warnings.warn(
            f"stormguard.{name} is deprecated; use stormguard.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(__name__), new)
    if name in _OPENAI_NAMES:
        value = _openai_client_class(name)
    else:
        module = _MODULES.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def _openai_client_class(name: str) -> Any:
    """``OpenAI``/``AsyncOpenAI``/``OpenAIError``: openai's client over stormguard (and
    openai's base error) where openai-python can be imported, else stormguard's
    ``Client``/``AsyncClient``/``StormguardError``."""
    if importlib.util.find_spec("openai") is not None:
        return getattr(importlib.import_module("._transport.openai_client", __name__), name)
    return getattr(importlib.import_module(__name__), _OPENAI_NAMES[name])


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


setup_logging()
