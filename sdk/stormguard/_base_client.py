"""Everything a client does that is not I/O: settings, URLs, headers, call specs.

Shaped like httpx's ``BaseClient``: ``Client`` and ``AsyncClient`` share one
``ClientCore`` and repeat only a thin chain of same-named I/O methods.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, TypedDict

import httpx

from ._body import ACCEPT_ENCODING, DEFAULT_MAX_RESPONSE_BYTES
from ._breaker import BreakerConfig, BreakerListener, BreakerRegistry
from ._budget import RetryBudget
from ._clock import Clock
from ._compat import Unpack
from ._discovery import (
    Discovery,
    DiscoveryConfig,
    DiscoveryListener,
    split_dns_scheme,
)
from ._ejection import EjectionConfig, EjectionListener, EjectionTracker, EjectionTransition
from ._endpoints import Endpoint, EndpointPicker, SpillOver, check_served, normalize_base_url
from ._events import Observer
from ._limiter import ConcurrencyLimiter
from ._models import APIResult, ChatCompletion, ChatCompletionChunk, Completion, ModelList, Record
from ._pipeline import CallSpec
from ._redact import Redactor
from ._retry import RetryPolicy
from ._stats import CallStats, StatsRecorder
from ._throttle import AdaptiveThrottle
from ._version import __version__
from .protocol import (
    HEADER_ENDPOINT_LOAD_METRICS_FORMAT,
    HEADER_PRIORITY,
    Priority,
    parse_priority,
)
from .telemetry import Telemetry
from .tokens import TokenPolicy

__all__ = ["DEFAULT_TIMEOUT", "NOT_GIVEN", "BaseClient", "ClientCore", "ClientOptions", "NotGiven"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Total time for one logical call, all attempts and sleeps included. Shorter
# than openai-python's 600 s on purpose: a caller that waits ten minutes keeps
# a queue slot on a server that is already behind.
DEFAULT_TIMEOUT = 120.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_BREAKER = BreakerConfig()
DEFAULT_EJECTION = EjectionConfig()
#: Spans and metrics through the global OpenTelemetry providers (no-ops until configured).
DEFAULT_TELEMETRY = Telemetry()


class NotGiven:
    """Sentinel for "argument not passed" where None is a meaningful value."""

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = NotGiven()


def _check_timeout(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {type(value).__name__}")
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return None if math.isinf(value) else float(value)


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
        model: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        default_headers: Mapping[str, str] | None = None,
        priority: Priority | str | None = None,
        retry_policy: RetryPolicy | None = None,
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
        if discovery is not None and not isinstance(discovery, DiscoveryConfig):
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
        if api_key is None:
            api_key = os.environ.get("STORMGUARD_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.api_key = api_key or None
        self.model = model
        self.timeout = _check_timeout(timeout, "timeout")
        self.connect_timeout = _check_timeout(connect_timeout, "connect_timeout")
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")
        self.max_response_bytes = max_response_bytes
        self.clock = clock or Clock()
        self.retry_policy = retry_policy or RetryPolicy()
        self.budget = retry_budget or RetryBudget(clock=self.clock)
        self.token_policy = token_policy
        if isinstance(fallback_models, str):
            raise TypeError("fallback_models must be a list of model names, not one string")
        self.fallback_models = tuple(fallback_models)
        self.rng = random.Random()
        self.stats = StatsRecorder()
        self.picker = EndpointPicker(
            [endpoint for endpoint, dns in entries if not dns],
            clock=self.clock,
            rng=self.rng,
            discovered=discovered,
        )
        #: The class of the client's calls (its ``x-priority``), which picks their pool.
        self.priority = (
            Priority(priority)
            if priority is not None
            else parse_priority({k.lower(): v for k, v in (default_headers or {}).items()})
        )
        for served in (model, *self.fallback_models):
            # A clear error now for a model, or a class, that no endpoint serves.
            check_served(self.endpoints, served, self.priority)
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
        headers.update({k.lower(): v for k, v in (default_headers or {}).items()})
        self.headers = headers
        #: Scrubs the credentials this client sends (headers, base URLs) from what it shows.
        self.redactor = Redactor.for_client(
            headers=headers, urls=[endpoint.base_url for endpoint in self.endpoints]
        )
        on_discovery = tuple(discovery_listeners)
        endpoints_discovered = getattr(telemetry, "endpoints_discovered", None)
        if callable(endpoints_discovered):  # an observer written before discovery has none
            on_discovery += (endpoints_discovered,)
        #: The DNS names this client follows (``_discovery.py``); None: no DNS name.
        self.discovery = (
            Discovery(
                entries,
                picker=self.picker,
                config=discovery,
                clock=self.clock,
                listeners=on_discovery,
                scrub=self.redactor.scrub,
            )
            if discovered
            else None
        )
        if self.discovery is not None:
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

    def attempt_timeout(self, remaining: float) -> httpx.Timeout:
        """httpx timeouts for one attempt: each operation may take what is left."""
        if not math.isfinite(remaining):
            return httpx.Timeout(None, connect=self.connect_timeout)
        connect = (
            remaining if self.connect_timeout is None else min(self.connect_timeout, remaining)
        )
        return httpx.Timeout(remaining, connect=connect)

    # -- call specs: what each endpoint sends -----------------------------------------

    def _timeout_for(self, timeout: float | NotGiven | None) -> float | None:
        if isinstance(timeout, NotGiven):
            return self.timeout
        return _check_timeout(timeout, "timeout")

    def _model_for(self, model: str | None) -> str:
        chosen = model or self.model
        if not chosen:
            raise ValueError("No model: pass model= to the call or to the client")
        return chosen

    def chat_spec(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str | None,
        stream: bool,
        timeout: float | NotGiven | None,
        extra_headers: Mapping[str, str] | None,
        extra_body: Mapping[str, Any] | None,
        params: Mapping[str, Any],
    ) -> CallSpec:
        if isinstance(messages, (str, bytes, Mapping)):
            raise TypeError("messages must be a list of message dicts")
        message_list = list(messages)
        if not all(isinstance(m, Mapping) for m in message_list):
            raise TypeError("each message must be a dict with 'role' and 'content'")
        return self._generation_spec(
            GenerationEndpoint.CHAT, "messages", message_list, model, stream, timeout,
            extra_headers, extra_body, params,
        )  # fmt: skip

    def completion_spec(
        self,
        *,
        prompt: str | list[str] | list[int],
        model: str | None,
        stream: bool,
        timeout: float | NotGiven | None,
        extra_headers: Mapping[str, str] | None,
        extra_body: Mapping[str, Any] | None,
        params: Mapping[str, Any],
    ) -> CallSpec:
        return self._generation_spec(
            GenerationEndpoint.COMPLETION, "prompt", prompt, model, stream, timeout,
            extra_headers, extra_body, params,
        )  # fmt: skip

    def _generation_spec(
        self,
        endpoint: GenerationEndpoint,
        input_field: str,
        input_value: object,
        model: str | None,
        stream: bool,
        timeout: float | NotGiven | None,
        extra_headers: Mapping[str, str] | None,
        extra_body: Mapping[str, Any] | None,
        params: Mapping[str, Any],
    ) -> CallSpec:
        chosen = self._model_for(model)
        body: dict[str, Any] = {"model": chosen, input_field: input_value}
        body.update(params)
        if extra_body:
            body.update(extra_body)
        if stream:
            body["stream"] = True
        return CallSpec(
            method="POST",
            path=endpoint.path,
            result_type=endpoint.result_type,
            operation=endpoint.operation,
            body=body,
            stream=stream,
            chunk_type=endpoint.chunk_type,
            model=chosen,
            timeout=self._timeout_for(timeout),
            headers=dict(extra_headers or {}),
        )

    def models_spec(
        self, *, timeout: float | NotGiven | None, extra_headers: Mapping[str, str] | None
    ) -> CallSpec:
        return CallSpec(
            method="GET",
            path="models",
            result_type=ModelList,
            operation="models",
            timeout=self._timeout_for(timeout),
            headers=dict(extra_headers or {}),
        )


class ClientOptions(TypedDict, total=False):
    """Keyword options of ``Client`` and ``AsyncClient`` (defaults in ``ClientCore``).

    ``timeout`` is the total time of one call, every attempt and backoff included
    (None: no limit); ``connect_timeout`` bounds each TCP connect; ``priority`` is
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
    docs/discovery.md has both.
    """

    base_url: BaseURL | None
    api_key: str | None
    model: str | None
    timeout: float | None
    connect_timeout: float
    default_headers: Mapping[str, str] | None
    priority: Priority | str | None
    retry_policy: RetryPolicy | None
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


class BaseClient:
    """Construction and introspection shared by ``Client`` and ``AsyncClient``."""

    def __init__(self, **options: Unpack[ClientOptions]) -> None:
        self._core = ClientCore(**options)

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
