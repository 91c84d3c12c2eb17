"""What a client is given, its arguments: its keyword options (``ClientOptions``), the ones
``with_options`` may change (``ClientChanges``, applied as ``CallSettings``), and
the per-call options every endpoint takes (``CallExtras``).

Types only, and the one check ``stream_timeouts`` needs wherever it is given; the
client applies them in ``_call/client_core.py`` and ``_call/settings.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from .._core.clock import Clock
from .._core.http import httpx
from .._policies.breaker.config import BreakerConfig
from .._policies.breaker.states import BreakerListener
from .._policies.fallback import Fallbacks
from .._policies.hedge.policy import HedgePolicy
from .._policies.limiter.limiter import ConcurrencyLimiter
from .._policies.quota import QuotaPolicy
from .._policies.retry.budget import RetryBudget
from .._policies.retry.retry import RetryPolicy
from .._policies.retry.throttle import AdaptiveThrottle
from .._policies.routing.affinity_config import DEFAULT_AFFINITY, AffinityPolicy
from .._policies.routing.ejection_config import EjectionConfig
from .._policies.routing.ejection_status import EjectionListener
from .._policies.routing.endpoint_config import Endpoint, SpillOver
from .._policies.routing.latency_config import LatencyRouting
from ..protocol import Priority
from ..telemetry._events import Observer
from .openai_conventions import NOT_GIVEN, NotGiven, TimeoutLike, Unset
from .stream_timeouts import StreamTimeouts

if TYPE_CHECKING:
    from .._policies.routing.discovery_config import DiscoveryConfig
    from .._policies.routing.dns_name import DiscoveryListener
    from ..tokens import TokenPolicy

__all__ = [
    "BaseURL",
    "CallExtras",
    "CallSettings",
    "CallTimeout",
    "ClientChanges",
    "ClientOptions",
    "StormguardOptions",
    "checked_stream_timeouts",
]


#: A call's ``timeout``: the total in seconds, an ``httpx.Timeout``
#: (``openai_conventions.py``), None for no limit, or ``NOT_GIVEN``/``omit`` for the
#: client's.
CallTimeout = float | TimeoutLike | None | Unset

#: One server, or several: URLs or ``Endpoint`` objects (with weights).
BaseURL = str | httpx.URL | Endpoint | Sequence[str | httpx.URL | Endpoint]


@dataclass(frozen=True, slots=True)
class CallExtras:
    """openai-python's per-call options every endpoint takes (``extra_body`` only
    where there is a body)."""

    timeout: CallTimeout = NOT_GIVEN
    extra_headers: Mapping[str, str] | None = None
    extra_query: Mapping[str, object] | None = None
    extra_body: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CallSettings:
    """The settings of a client that ``with_options`` may change; everything else
    (endpoints, budget, limiter, breakers, ejection, discovery, clock, telemetry,
    the connection pool) a derived client shares with its parent."""

    api_key: str | None
    organization: str | None
    project: str | None
    model: str | None
    timeout: float | TimeoutLike | None
    connect_timeout: float | NotGiven | None
    default_headers: Mapping[str, str] | None
    default_query: Mapping[str, object] | None
    priority: Priority | str | None
    retry_policy: RetryPolicy
    max_response_bytes: int
    token_policy: TokenPolicy | None
    fallback_models: Sequence[str] | Fallbacks
    stream_timeouts: StreamTimeouts | None = None
    affinity: AffinityPolicy | None = DEFAULT_AFFINITY
    hedge: HedgePolicy | None = None
    latency_routing: LatencyRouting | None = None


def checked_stream_timeouts(value: object) -> StreamTimeouts | None:
    """``value`` as a ``stream_timeouts`` option: a ``StreamTimeouts`` or None."""
    if value is not None and not isinstance(value, StreamTimeouts):
        raise TypeError(
            "stream_timeouts must be a stormguard.StreamTimeouts or None,"
            f" got {type(value).__name__}"
        )
    return value


class StormguardOptions(TypedDict, total=False):
    """The options of ``Client`` that openai-python's clients do not have: those
    ``stormguard.OpenAI`` takes beside openai's own arguments (``ClientOptions``
    says what each does)."""

    model: str | None
    connect_timeout: float | None
    priority: Priority | str | None
    retry_policy: RetryPolicy | None
    retry_budget: RetryBudget | None
    max_response_bytes: int
    token_policy: TokenPolicy | None
    fallback_models: Sequence[str] | Fallbacks
    breaker: BreakerConfig | None
    breaker_listeners: Sequence[BreakerListener]
    ejection: EjectionConfig | None
    ejection_listeners: Sequence[EjectionListener]
    throttle: AdaptiveThrottle | None
    concurrency: ConcurrencyLimiter | None
    telemetry: Observer | None
    clock: Clock | None
    discover: Literal["dns"] | None
    discovery: DiscoveryConfig | None
    discovery_listeners: Sequence[DiscoveryListener]
    spill_over: SpillOver | None
    stream_timeouts: StreamTimeouts | None
    quota: QuotaPolicy | None
    affinity: AffinityPolicy | None
    hedge: HedgePolicy | None
    latency_routing: LatencyRouting | None


class ClientOptions(StormguardOptions, total=False):
    """Keyword options of ``Client`` and ``AsyncClient`` (defaults in ``ClientCore``).

    ``timeout`` is the total time of one call, every attempt and backoff included
    (None: no limit; an ``httpx.Timeout`` gives its ``read`` as the total and its
    ``connect``, ``write`` and ``pool`` as bounds of each attempt, docs/retries.md
    "Deadlines"); ``connect_timeout`` bounds each TCP connect; ``max_retries=N`` is
    openai's shorthand for ``retry_policy=RetryPolicy(max_attempts=N + 1)`` (not
    both); ``organization`` and ``project`` (default: ``OPENAI_ORG_ID`` and
    ``OPENAI_PROJECT_ID``) are sent as ``OpenAI-Organization`` and
    ``OpenAI-Project``; ``default_query`` goes into every URL; ``priority`` is
    sent as ``x-priority``; ``retry_budget`` may be shared with other clients;
    ``base_url`` may list several servers (or ``Endpoint`` objects with weights):
    each attempt goes to the less loaded of two, a retry to another one;
    ``max_response_bytes`` caps a response body; ``token_policy`` counts tokens
    and refuses what cannot fit before any I/O (``stormguard.tokens``);
    ``fallback_models`` serve a call, in order, when the model asked for is
    overloaded or its breaker is open (the result says ``degraded``), and a
    ``stormguard.Fallbacks`` also routes requests too long for a model, or refused
    by its content filter (docs/providers.md); ``breaker``
    configures the circuit breaker of every (endpoint, model), None turns them
    off, ``breaker_listeners`` receive their state changes; ``ejection`` says
    when an endpoint of several leaves rotation (unreachable at once, failing by
    Envoy's outlier rules) and how it returns, None turns it off,
    ``ejection_listeners`` receive every ``EjectionTransition``; ``concurrency`` is
    the adaptive concurrency limit per endpoint (a ``ConcurrencyLimiter`` of its
    own by default; pass one object to several clients to share it, None turns
    it off): calls over the limit wait locally within their deadline, and sheds
    go back to that queue; ``throttle`` adds
    SRE-style adaptive throttling; ``telemetry`` records spans and metrics
    (``stormguard.telemetry.Telemetry``: the global OpenTelemetry providers by
    default, None turns it off); ``clock`` is for tests
    (``stormguard.testing.FakeClock``). ``discover="dns"`` makes every
    ``base_url`` a DNS name whose addresses are the endpoints (a ``dns+http://``
    URL does it for one), ``discovery`` tunes how they are looked up
    (``DiscoveryConfig``), ``discovery_listeners`` receive every
    ``DiscoveryChange``; ``spill_over`` lets calls of some classes use another
    class's endpoints when those report headroom (``SpillOver``; None: never).
    docs/discovery.md has both. ``openai_errors=True`` raises every error as a class
    that is also openai-python's, for ``except openai.APIError`` (needs openai;
    ``stormguard.openai_errors``, docs/errors.md). ``stream_timeouts`` bounds each
    stream's wait for its first chunk (retried when it passes) and its gaps, and with
    ``idle`` lets a stream that keeps sending outlive ``timeout`` (``StreamTimeouts``,
    also per call; docs/retries.md). ``quota`` paces every call to its API key's
    quota (tokens and requests per minute), learned from the provider's
    ``x-ratelimit-*`` headers and 429s (``QuotaPolicy()`` by default; None turns it
    off; docs/quotas.md). ``affinity`` sends calls that share a prompt prefix to
    the same endpoint of several, for its prefix cache: a call's
    ``prompt_cache_key``, or with ``derive_from_prompt`` the start of its prompt,
    picks the endpoint while its load stays within a bound (``AffinityPolicy()`` by
    default; None turns it off; docs/resilience.md, "Prefix-cache affinity").
    ``hedge`` sends one more attempt of a call that is slow to answer to another
    endpoint, and keeps the first answer (``HedgePolicy``; None, the default, turns
    it off; also per call; docs/resilience.md, "Hedged requests").
    ``latency_routing`` ranks endpoints of several by how fast they have answered
    this client as well as by load, so that a replica slowed by others' calls is
    avoided (``LatencyRouting``, peak EWMA; None, the default, turns it off;
    docs/resilience.md, "Latency-aware choice").
    """

    base_url: BaseURL | None
    api_key: str | None
    organization: str | None
    project: str | None
    timeout: float | TimeoutLike | None
    default_headers: Mapping[str, str] | None
    default_query: Mapping[str, object] | None
    max_retries: int
    openai_errors: bool


class ClientChanges(TypedDict, total=False):
    """What ``with_options`` may change (``CallSettings``, and ``max_retries``)."""

    api_key: str | None
    organization: str | None
    project: str | None
    model: str | None
    timeout: float | TimeoutLike | None
    connect_timeout: float | None
    default_headers: Mapping[str, str] | None
    default_query: Mapping[str, object] | None
    priority: Priority | str | None
    retry_policy: RetryPolicy | None
    max_retries: int
    max_response_bytes: int
    token_policy: TokenPolicy | None
    fallback_models: Sequence[str] | Fallbacks
    stream_timeouts: StreamTimeouts | None
    affinity: AffinityPolicy | None
    hedge: HedgePolicy | None
    latency_routing: LatencyRouting | None
