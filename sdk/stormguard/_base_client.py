"""Everything a client does that is not I/O: settings, URLs, headers, call specs.

Shaped like httpx's ``BaseClient``: ``Client`` and ``AsyncClient`` share one
``ClientCore`` and repeat only a thin chain of same-named I/O methods.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

from ._body import ACCEPT_ENCODING, DEFAULT_MAX_RESPONSE_BYTES
from ._breaker import BreakerConfig, BreakerListener, BreakerRegistry
from ._budget import RetryBudget
from ._clock import Clock
from ._compat import Self, Unpack
from ._ejection import EjectionConfig, EjectionListener, EjectionTracker, EjectionTransition
from ._endpoints import (
    Endpoint,
    EndpointPicker,
    SpillOver,
    check_served,
    normalize_base_url,
    split_dns_scheme,
)
from ._events import Observer
from ._http import http_client_types, httpx, primary_limits
from ._limiter import ConcurrencyLimiter
from ._models import APIResult, ChatCompletion, ChatCompletionChunk, Completion, ModelList, Record
from ._options import (
    NOT_GIVEN,
    AttemptTimeouts,
    NotGiven,
    TimeoutLike,
    Unset,
    check_timeout,
    drop_omitted,
    is_omitted,
    path_with_query,
    retry_policy_from,
    split_timeout,
)
from ._pipeline import CallSpec
from ._redact import Redactor
from ._retry import RetryPolicy
from ._stats import CallStats, StatsRecorder
from ._stream_timeouts import StreamTimeouts
from ._throttle import AdaptiveThrottle
from ._version import __version__
from .openai_errors import openai_errors_option
from .protocol import (
    HEADER_ENDPOINT_LOAD_METRICS_FORMAT,
    HEADER_PRIORITY,
    Priority,
    parse_priority,
)
from .telemetry import Telemetry

if TYPE_CHECKING:
    from ._discovery import Discovery, DiscoveryConfig, DiscoveryListener
    from .tokens import TokenPolicy  # the pre-check loads on first use

__all__ = [
    "DEFAULT_CONNECTION_LIMITS",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "BaseClient",
    "CallExtras",
    "CallSettings",
    "CallTimeout",
    "ClientChanges",
    "ClientCore",
    "ClientOptions",
    "NotGiven",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Total time for one logical call, all attempts and sleeps included. Shorter
# than openai-python's 600 s on purpose: a caller that waits ten minutes keeps
# a queue slot on a server that is already behind.
DEFAULT_TIMEOUT = 120.0
DEFAULT_CONNECT_TIMEOUT = 10.0
#: The pool of a client's own httpx client, sized for LLM fan-out as openai-python's is:
#: a thousand calls at once, a hundred idle connections kept.
DEFAULT_CONNECTION_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
DEFAULT_BREAKER = BreakerConfig()
DEFAULT_EJECTION = EjectionConfig()
#: Spans and metrics through the global OpenTelemetry providers (no-ops until configured).
DEFAULT_TELEMETRY = Telemetry()


@dataclass(frozen=True)
class GenerationEndpoint:
    """An endpoint that generates text: where it lives and what it returns."""

    path: str
    operation: str
    result_type: type[APIResult]
    chunk_type: type[Record]

    CHAT: ClassVar[GenerationEndpoint]
    COMPLETION: ClassVar[GenerationEndpoint]


GenerationEndpoint.CHAT = GenerationEndpoint(
    "chat/completions", "chat", ChatCompletion, ChatCompletionChunk
)
GenerationEndpoint.COMPLETION = GenerationEndpoint(
    "completions", "text_completion", Completion, Completion
)


#: A call's ``timeout``: the total in seconds, an ``httpx.Timeout`` (``_options.py``),
#: None for no limit, or ``NOT_GIVEN``/``omit`` for the client's.
CallTimeout = float | TimeoutLike | None | Unset

#: One server, or several: URLs or ``Endpoint`` objects (with weights).
BaseURL = str | httpx.URL | Endpoint | Sequence[str | httpx.URL | Endpoint]


def _endpoints_from(base_url: BaseURL, discover: str | None) -> list[tuple[Endpoint, bool]]:
    """The client's endpoints, each with whether it is a DNS name to discover
    (``discover="dns"``, or a ``dns+http(s)://`` URL); the ``dns+`` is taken off."""
    if discover not in (None, "dns"):
        raise ValueError(f'discover must be "dns" or None, got {discover!r}')
    items: Sequence[str | httpx.URL | Endpoint]
    if isinstance(base_url, (str, httpx.URL, Endpoint)):
        items = [base_url]
    else:
        items = list(base_url)
        if not items:
            raise ValueError("base_url is an empty list: give at least one server")
    entries: list[tuple[Endpoint, bool]] = []
    for item in items:
        endpoint = item if isinstance(item, Endpoint) else Endpoint(str(item))
        url, dns = split_dns_scheme(str(endpoint.base_url))
        if dns:
            endpoint = replace(endpoint, base_url=url)
        normalize_base_url(endpoint.base_url)  # a clear error now, not at the first call
        entries.append((endpoint, dns or discover == "dns"))
    return entries


class ClientCore:
    """Resolved settings and shared state of one client (sync or async)."""

    def __init__(
        self,
        *,
        base_url: BaseURL | None = None,
        api_key: str | None = None,
        organization: str | None = None,
        project: str | None = None,
        model: str | None = None,
        timeout: float | TimeoutLike | None = DEFAULT_TIMEOUT,
        connect_timeout: float | NotGiven | None = NOT_GIVEN,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        priority: Priority | str | None = None,
        retry_policy: RetryPolicy | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        retry_budget: RetryBudget | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        token_policy: TokenPolicy | None = None,
        fallback_models: Sequence[str] = (),
        breaker: BreakerConfig | None = DEFAULT_BREAKER,
        breaker_listeners: Sequence[BreakerListener] = (),
        ejection: EjectionConfig | None = DEFAULT_EJECTION,
        ejection_listeners: Sequence[EjectionListener] = (),
        throttle: AdaptiveThrottle | None = None,
        concurrency: ConcurrencyLimiter | NotGiven | None = NOT_GIVEN,
        telemetry: Observer | None = DEFAULT_TELEMETRY,
        clock: Clock | None = None,
        discover: Literal["dns"] | None = None,
        discovery: DiscoveryConfig | None = None,
        discovery_listeners: Sequence[DiscoveryListener] = (),
        spill_over: SpillOver | None = None,
        openai_errors: bool = False,
        stream_timeouts: StreamTimeouts | None = None,
    ) -> None:
        if base_url is None:
            base_url = (
                os.environ.get("STORMGUARD_BASE_URL")
                or os.environ.get("OPENAI_BASE_URL")
                or DEFAULT_BASE_URL
            )
        entries = _endpoints_from(base_url, discover)
        #: The endpoints as given (a DNS name stands for all its addresses).
        self.endpoints = [endpoint for endpoint, _ in entries]
        discovered = any(dns for _, dns in entries)
        if discovery is not None:
            from ._discovery import DiscoveryConfig  # DNS discovery: loaded when asked for

            if not isinstance(discovery, DiscoveryConfig):
                raise TypeError(
                    "discovery must be a stormguard.DiscoveryConfig or None, got"
                    f" {type(discovery).__name__}"
                )
        if spill_over is not None and not isinstance(spill_over, SpillOver):
            raise TypeError(
                "spill_over must be a stormguard.SpillOver or None, got"
                f" {type(spill_over).__name__}"
            )
        #: Which other pools' endpoints a call of a class may use (None: none).
        self.spill_over = spill_over
        #: Raise errors as classes that are also openai's (``stormguard.openai_errors``).
        self.openai_errors = openai_errors_option(openai_errors)
        self.clock = clock or Clock()
        self.budget = retry_budget or RetryBudget(clock=self.clock)
        self.rng = random.Random()
        self.stats = StatsRecorder()
        self.picker = EndpointPicker(
            [endpoint for endpoint, dns in entries if not dns],
            clock=self.clock,
            rng=self.rng,
            discovered=discovered,
        )
        if api_key is None:
            api_key = os.environ.get("STORMGUARD_API_KEY") or os.environ.get("OPENAI_API_KEY")
        if organization is None:
            organization = os.environ.get("OPENAI_ORG_ID")
        if project is None:
            project = os.environ.get("OPENAI_PROJECT_ID")
        self._configure(
            CallSettings(
                api_key=api_key,
                organization=organization,
                project=project,
                model=model,
                timeout=timeout,
                connect_timeout=connect_timeout,
                default_headers=default_headers,
                default_query=default_query,
                priority=priority,
                retry_policy=retry_policy_from(retry_policy, max_retries),
                max_response_bytes=max_response_bytes,
                token_policy=token_policy,
                fallback_models=fallback_models,
                stream_timeouts=stream_timeouts,
            )
        )
        #: Receives every call's events (spans, metrics); None: no events at all.
        self.observer = telemetry
        listeners = tuple(breaker_listeners)
        if telemetry is not None:
            listeners += (telemetry.breaker_changed,)
        #: One breaker per (endpoint, model); None when breakers are turned off.
        self.breakers = (
            None
            if breaker is None
            else BreakerRegistry(breaker, clock=self.clock, rng=self.rng, listeners=listeners)
        )
        if ejection is not None and not isinstance(ejection, EjectionConfig):
            raise TypeError(
                "ejection must be a stormguard.EjectionConfig or None, got"
                f" {type(ejection).__name__}"
            )
        on_ejection = (*ejection_listeners, self._ejected)
        endpoint_changed = getattr(telemetry, "endpoint_changed", None)
        if callable(endpoint_changed):  # an observer written before ejection has none
            on_ejection += (endpoint_changed,)
        #: Which endpoints are in rotation (``_ejection.py``); None when turned off.
        self.ejection = (
            None
            if ejection is None
            else EjectionTracker(
                ejection,
                states=lambda: self.picker.states,
                clock=self.clock,
                rng=self.rng,
                listeners=on_ejection,
            )
        )
        self.throttle = throttle
        if concurrency is not None and not isinstance(concurrency, (ConcurrencyLimiter, NotGiven)):
            raise TypeError(
                "concurrency must be a stormguard.ConcurrencyLimiter or None, got"
                f" {type(concurrency).__name__}"
            )
        #: Adaptive concurrency per endpoint; None when turned off.
        self.limiter = (
            ConcurrencyLimiter(clock=self.clock)
            if isinstance(concurrency, NotGiven)
            else concurrency
        )
        #: The first endpoint as given (a DNS name as written): token lookups and
        #: ``client.base_url`` use it.
        self.base_url = normalize_base_url(self.endpoints[0].base_url)[0]
        first = httpx.URL(self.base_url)
        #: ``server.address`` / ``server.port`` of the call spans.
        self.server_address: str | None = first.host or None
        self.server_port: int | None = first.port or (443 if first.scheme == "https" else 80)
        on_discovery = tuple(discovery_listeners)
        endpoints_discovered = getattr(telemetry, "endpoints_discovered", None)
        if callable(endpoints_discovered):  # an observer written before discovery has none
            on_discovery += (endpoints_discovered,)
        #: The DNS names this client follows (``_discovery.py``); None: no DNS name.
        self.discovery: Discovery | None = None
        if discovered:
            from ._discovery import Discovery  # loads with the first client following a name

            self.discovery = Discovery(
                entries,
                picker=self.picker,
                config=discovery,
                clock=self.clock,
                listeners=on_discovery,
                scrub=self.redactor.scrub,
            )
            self.discovery.start()

    def _ejected(self, transition: EjectionTransition) -> None:
        """An endpoint ejected as unreachable may be gone for good (a pod replaced by
        one at another address): its DNS name is looked at again, within the floor."""
        discovery = getattr(self, "discovery", None)
        if discovery is not None and transition.reason in ("unreachable", "probe_failed"):
            discovery.request_refresh()

    def netlocs(self) -> set[str]:
        """``host:port`` of every endpoint, and of every DNS name as written."""
        ours = {httpx.URL(state.base_url).netloc.decode("ascii") for state in self.picker.states}
        if self.discovery is not None:
            ours |= self.discovery.netlocs()
        return ours

    def _configure(self, settings: CallSettings) -> None:
        """Apply what a client's calls send and how long they may take: the part of
        the settings that ``with_options`` may change (``CallSettings``)."""
        self.settings = settings
        self.api_key = settings.api_key or None
        self.organization = settings.organization
        self.project = settings.project
        self.model = settings.model
        self.timeout, limits = split_timeout(settings.timeout)
        connect = settings.connect_timeout
        if limits is not None and not isinstance(connect, NotGiven):
            raise ValueError(
                "connect_timeout and an httpx.Timeout as timeout both set the connect"
                " timeout: give it in the Timeout only"
            )
        if limits is None:
            connect = DEFAULT_CONNECT_TIMEOUT if isinstance(connect, NotGiven) else connect
            limits = AttemptTimeouts(connect=check_timeout(connect, "connect_timeout"))
        #: Bounds of each attempt's connect, write and pool wait.
        self.attempt_timeouts = limits
        self.connect_timeout = limits.connect
        if settings.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")
        self.max_response_bytes = settings.max_response_bytes
        self.retry_policy = settings.retry_policy
        self.token_policy = settings.token_policy
        if self.token_policy is not None:  # one clock: a policy without its own takes ours
            self.token_policy.adopt_clock(self.clock)
        if isinstance(settings.fallback_models, str):
            raise TypeError("fallback_models must be a list of model names, not one string")
        self.fallback_models = tuple(settings.fallback_models)
        #: First-chunk, idle and overall bounds of every stream (None: the timeout only).
        self.stream_timeouts = _stream_timeouts(settings.stream_timeouts)
        default_headers = drop_omitted(settings.default_headers or {})
        priority = settings.priority
        #: The class of the client's calls (its ``x-priority``), which picks their pool.
        self.priority = (
            Priority(priority)
            if priority is not None
            else parse_priority({k.lower(): v for k, v in default_headers.items()})
        )
        for served in (self.model, *self.fallback_models):
            # A clear error now for a model, or a class, that no endpoint serves.
            check_served(self.endpoints, served, self.priority)
        headers = {
            "accept": "application/json",
            # Only what is decoded in bounded steps (``_body.py``): a gzip bomb stops at the cap.
            "accept-encoding": ACCEPT_ENCODING,
            "content-type": "application/json",
            "user-agent": f"stormguard/{__version__}",
            # Plain vLLM then reports its load (ORCA) on every non-streaming answer.
            HEADER_ENDPOINT_LOAD_METRICS_FORMAT: "TEXT",
        }
        if priority is not None:
            headers[HEADER_PRIORITY] = Priority(priority).value
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        # openai-python's names and sources (OPENAI_ORG_ID, OPENAI_PROJECT_ID).
        if self.organization is not None:
            headers["openai-organization"] = self.organization
        if self.project is not None:
            headers["openai-project"] = self.project
        headers.update({k.lower(): v for k, v in default_headers.items()})
        self.headers = headers
        #: Query parameters of every request (``extra_query`` adds to them per call).
        self.default_query: Mapping[str, object] = drop_omitted(settings.default_query or {})
        #: Scrubs the credentials this client sends (headers, base URLs) from what it shows.
        self.redactor = Redactor.for_client(
            headers=headers, urls=[endpoint.base_url for endpoint in self.endpoints]
        )

    def derive(self, changes: Mapping[str, Any]) -> ClientCore:
        """A core with some call settings changed that shares everything else: the
        endpoints, budget, limiter, breakers, ejection, discovery, stats and observer
        (``with_options``). ``default_headers`` and ``default_query`` add to the
        current ones, as openai-python's ``copy`` does."""
        unknown = set(changes) - set(CallSettings.__dataclass_fields__) - {"max_retries"}
        if unknown:
            raise TypeError(
                f"with_options cannot change {', '.join(sorted(unknown))}: it shares the"
                " connection pool and resilience state; make a new client for that"
            )
        given = dict(changes)
        current = self.settings
        if "max_retries" in given:
            policy = retry_policy_from(
                given.pop("retry_policy", None), given.pop("max_retries"), base=self.retry_policy
            )
            given["retry_policy"] = policy
        elif given.get("retry_policy", current.retry_policy) is None:
            given["retry_policy"] = RetryPolicy()
        for name in ("default_headers", "default_query"):
            if given.get(name) is not None:
                given[name] = {**(getattr(current, name) or {}), **given[name]}
        if "timeout" in given and "connect_timeout" not in given:
            # A new Timeout brings its own connect; a number keeps the current one.
            given["connect_timeout"] = (
                NOT_GIVEN
                if split_timeout(given["timeout"])[1] is not None
                else self.attempt_timeouts.connect
            )
        derived = copy.copy(self)
        derived._configure(replace(current, **given))
        return derived

    def attempt_timeout(
        self, remaining: float, limits: AttemptTimeouts | None = None
    ) -> httpx.Timeout:
        """httpx timeouts for one attempt: each operation may take what is left, and
        no more than its bound (the call's own ``Timeout``, else the client's)."""
        return (limits or self.attempt_timeouts).for_attempt(remaining)

    # -- call specs: what each endpoint sends -----------------------------------------

    def _timeout_for(self, timeout: CallTimeout) -> tuple[float | None, AttemptTimeouts | None]:
        if is_omitted(timeout):
            return self.timeout, None
        return split_timeout(timeout)

    def _model_for(self, model: str | None) -> str:
        chosen = (None if is_omitted(model) else model) or self.model
        if not chosen:
            raise ValueError("No model: pass model= to the call or to the client")
        return chosen

    def chat_spec(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str | None,
        stream: bool | None,
        extras: CallExtras,
        params: Mapping[str, Any],
    ) -> CallSpec:
        if isinstance(messages, (str, bytes, Mapping)):
            raise TypeError("messages must be a list of message dicts")
        message_list = list(messages)
        if not all(isinstance(m, Mapping) for m in message_list):
            raise TypeError("each message must be a dict with 'role' and 'content'")
        return self._generation_spec(
            GenerationEndpoint.CHAT, "messages", drop_omitted(message_list), model, stream,
            extras, params,
        )  # fmt: skip

    def completion_spec(
        self,
        *,
        prompt: str | list[str] | list[int],
        model: str | None,
        stream: bool | None,
        extras: CallExtras,
        params: Mapping[str, Any],
    ) -> CallSpec:
        return self._generation_spec(
            GenerationEndpoint.COMPLETION, "prompt", prompt, model, stream, extras, params
        )

    def _generation_spec(
        self,
        endpoint: GenerationEndpoint,
        input_field: str,
        input_value: object,
        model: str | None,
        stream: bool | None,
        extras: CallExtras,
        params: Mapping[str, Any],
    ) -> CallSpec:
        chosen = self._model_for(model)
        streaming = bool(stream) and not is_omitted(stream)
        # A stream's own bounds come among the keywords that are the body's otherwise.
        params = dict(params)
        stream_timeouts = params.pop("stream_timeouts", NOT_GIVEN)
        body: dict[str, Any] = {"model": chosen, input_field: input_value}
        body.update(drop_omitted(params))
        if extras.extra_body:
            body.update(drop_omitted(extras.extra_body))
        if streaming:
            body["stream"] = True
        return self._spec(
            extras,
            method="POST",
            path=endpoint.path,
            result_type=endpoint.result_type,
            operation=endpoint.operation,
            body=body,
            stream=streaming,
            chunk_type=endpoint.chunk_type,
            model=chosen,
            stream_timeouts=(
                None  # the client's
                if is_omitted(stream_timeouts)
                else _stream_timeouts(stream_timeouts) or StreamTimeouts()
            ),
        )

    def models_spec(self, *, extras: CallExtras) -> CallSpec:
        return self._spec(
            extras, method="GET", path="models", result_type=ModelList, operation="models"
        )

    def _spec(self, extras: CallExtras, *, path: str, **fields: Any) -> CallSpec:
        """The spec with what every endpoint takes: the timeout, the headers and the
        query (``default_query`` and ``extra_query``, in the URL as openai sends it)."""
        total, limits = self._timeout_for(extras.timeout)
        return CallSpec(
            path=path_with_query(path, self.default_query, extras.extra_query),
            timeout=total,
            attempt_timeouts=limits,
            headers={
                name: value
                for name, value in (extras.extra_headers or {}).items()
                if not is_omitted(value)
            },
            **fields,
        )


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
    fallback_models: Sequence[str]
    stream_timeouts: StreamTimeouts | None = None


def _stream_timeouts(value: object) -> StreamTimeouts | None:
    if value is not None and not isinstance(value, StreamTimeouts):
        raise TypeError(
            "stream_timeouts must be a stormguard.StreamTimeouts or None,"
            f" got {type(value).__name__}"
        )
    return value


class ClientOptions(TypedDict, total=False):
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
    overloaded or its breaker is open (the result says ``degraded``); ``breaker``
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
    also per call; docs/retries.md).
    """

    base_url: BaseURL | None
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
    retry_budget: RetryBudget | None
    max_response_bytes: int
    token_policy: TokenPolicy | None
    fallback_models: Sequence[str]
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
    openai_errors: bool
    stream_timeouts: StreamTimeouts | None


def check_http_options(
    http_client: object, kind: Literal["Client", "AsyncClient"], connection_limits: object
) -> httpx.Limits | None:
    """A clear error for an ``http_client`` of the wrong kind (not an httpx or httpx2
    ``kind``), or one given with ``connection_limits`` (which size only the client's
    own pool); the limits as the primary library's."""
    if http_client is not None and not isinstance(http_client, http_client_types(kind)):
        raise TypeError(
            f"http_client must be an httpx.{kind} or an httpx2.{kind},"
            f" got {type(http_client).__name__}"
        )
    if http_client is not None and connection_limits is not None:
        raise TypeError(
            "connection_limits sizes the client's own pool: with your own http_client,"
            " set limits on it instead"
        )
    return None if connection_limits is None else primary_limits(connection_limits)


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
    fallback_models: Sequence[str]
    stream_timeouts: StreamTimeouts | None


class BaseClient:
    """Construction and introspection shared by ``Client`` and ``AsyncClient``."""

    _owns_http: bool

    def __init__(self, **options: Unpack[ClientOptions]) -> None:
        self._core = ClientCore(**options)

    def _bind_resources(self) -> None:
        """Create ``chat``, ``completions``, ``models`` ... bound to this client."""
        raise NotImplementedError

    def with_options(self, **changes: Unpack[ClientChanges]) -> Self:
        """A client with some settings changed (``ClientChanges``) that shares this
        one's connection pool and resilience state: retry budget, concurrency
        limiter, breakers, ejection, discovery and stats, as openai-python's
        ``client.with_options(timeout=...)`` shares its pool. Closing it leaves the
        pool open: close the client it came from. ``default_headers`` and
        ``default_query`` add to the current ones."""
        derived = copy.copy(self)
        derived._core = self._core.derive(changes)
        derived._owns_http = False
        derived._bind_resources()
        return derived

    #: openai-python's name for ``with_options``.
    copy = with_options

    @property
    def api_key(self) -> str | None:
        return self._core.api_key

    @property
    def organization(self) -> str | None:
        return self._core.organization

    @property
    def project(self) -> str | None:
        return self._core.project

    @property
    def timeout(self) -> float | None:
        """The total time of one call (None: no limit)."""
        return self._core.timeout

    @property
    def max_retries(self) -> int:
        """Retries after the first attempt (``retry_policy.max_attempts - 1``)."""
        return self._core.retry_policy.max_attempts - 1

    @property
    def default_query(self) -> Mapping[str, object]:
        return self._core.default_query

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def retry_budget(self) -> RetryBudget:
        """The budget this client spends its retries from."""
        return self._core.budget

    @property
    def concurrency(self) -> ConcurrencyLimiter | None:
        """The adaptive concurrency limiter this client waits in (None: turned off)."""
        return self._core.limiter

    def stats(self) -> CallStats:
        """Logical calls, attempts, retries, failovers, requeues, budget refusals,
        fallbacks, retry amplification, every breaker's state, every endpoint's limit
        and ejection status, and what DNS discovery found."""
        core = self._core
        breakers, limiter, ejection = core.breakers, core.limiter, core.ejection
        return core.stats.snapshot(
            breakers=tuple(breakers.snapshot().values()) if breakers is not None else (),
            concurrency=limiter.state() if limiter is not None else (),
            endpoints=ejection.snapshot() if ejection is not None else (),
            endpoint_names=tuple(state.name for state in core.picker.states),
            discovery=core.discovery.snapshot() if core.discovery is not None else (),
        )

    def __repr__(self) -> str:
        # Never the API key, nor a password in the URL (http://user:KEY@host).
        url = httpx.URL(self._core.base_url)
        shown = str(url.copy_with(userinfo=b"redacted")) if url.userinfo else str(url)
        return f"{type(self).__name__}(base_url={shown!r}, model={self._core.model!r})"
