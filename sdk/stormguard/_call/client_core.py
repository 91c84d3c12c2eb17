"""The state one client shares between its calls (``ClientCore``): its endpoints,
retry budget, breakers, ejection, concurrency limiter, DNS discovery, stats and
observer, built once from the client's options. A client made by
``with_options`` shares all of it; only its settings (``_call/settings.py``)
are its own. The call specs come from ``_call/spec_builder.py``, below it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from .._core.clock import Clock
from .._core.http import httpx
from .._io.body import DEFAULT_MAX_RESPONSE_BYTES
from .._policies.breaker.config import BreakerConfig
from .._policies.breaker.registry import BreakerRegistry
from .._policies.breaker.states import BreakerListener
from .._policies.fallback import Fallbacks
from .._policies.hedge.policy import HedgePolicy
from .._policies.hedge.state import HedgeState
from .._policies.limiter.limiter import ConcurrencyLimiter
from .._policies.quota import QuotaGate, QuotaPolicy
from .._policies.retry.budget import RetryBudget
from .._policies.retry.retry import RetryPolicy
from .._policies.retry.throttle import AdaptiveThrottle
from .._policies.routing.affinity_config import DEFAULT_AFFINITY, AffinityPolicy
from .._policies.routing.base_url import normalize_base_url, split_dns_scheme
from .._policies.routing.deployment import Deployment
from .._policies.routing.ejection import EjectionTracker
from .._policies.routing.ejection_config import EjectionConfig
from .._policies.routing.ejection_status import EjectionListener, EjectionTransition
from .._policies.routing.endpoint_config import Endpoint, SpillOver
from .._policies.routing.latency_config import LatencyRouting
from .._policies.routing.picker import EndpointPicker
from .._policies.routing.tiers import TierWatch
from ..openai_errors import openai_errors_option
from ..protocol import Priority
from ..telemetry import Telemetry
from ..telemetry._events import Observer
from .arguments import BaseURL, CallSettings
from .openai_conventions import NOT_GIVEN, NotGiven, TimeoutLike, retry_policy_from
from .spec_builder import SpecBuilder
from .stats import StatsRecorder
from .stream_timeouts import StreamTimeouts

if TYPE_CHECKING:
    from .._policies.routing.discovery import Discovery
    from .._policies.routing.discovery_config import DiscoveryConfig
    from .._policies.routing.dns_name import DiscoveryChange, DiscoveryListener
    from ..tokens import TokenPolicy

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_BREAKER",
    "DEFAULT_EJECTION",
    "DEFAULT_QUOTA",
    "DEFAULT_TELEMETRY",
    "DEFAULT_TIMEOUT",
    "ClientCore",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Total time for one logical call, all attempts and sleeps included. Shorter
# than openai-python's 600 s on purpose: a caller that waits ten minutes keeps
# a queue slot on a server that is already behind.
DEFAULT_TIMEOUT = 120.0
DEFAULT_BREAKER = BreakerConfig()
DEFAULT_EJECTION = EjectionConfig()
#: Pacing to each key's quota, on by default (it costs nothing until a quota signal).
DEFAULT_QUOTA = QuotaPolicy()
#: Spans and metrics through the global OpenTelemetry providers (no-ops until configured).
DEFAULT_TELEMETRY = Telemetry()


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
        if isinstance(endpoint, Deployment):
            endpoint = endpoint.resolved()  # its key from the environment, read once
        url, dns = split_dns_scheme(str(endpoint.base_url))
        if dns:
            endpoint = replace(endpoint, base_url=url)
        normalize_base_url(endpoint.base_url)  # a clear error now, not at the first call
        entries.append((endpoint, dns or discover == "dns"))
    return entries


class ClientCore(SpecBuilder):
    """Resolved settings and shared state of one client (sync or async)."""

    #: Closes the client's own pool once nothing holds this core or a copy of it: the
    #: client, its ``with_options`` copies, their calls (``unclosed.PoolFinalizer``,
    #: set by the client). None: the pool was passed in.
    pool_finalizer: object | None = None

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
        fallback_models: Sequence[str] | Fallbacks = (),
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
        quota: QuotaPolicy | None = DEFAULT_QUOTA,
        affinity: AffinityPolicy | None = DEFAULT_AFFINITY,
        hedge: HedgePolicy | None = None,
        latency_routing: LatencyRouting | None = None,
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
        #: Some endpoint is a ``Deployment``: calls choose by tier, and each attempt
        #: sends its deployment's credential, model name and query (docs/providers.md).
        self.tiered = any(isinstance(endpoint, Deployment) for endpoint in self.endpoints)
        discovered = any(dns for _, dns in entries)
        self.several_endpoints = len(entries) > 1 or discovered
        if discovery is not None:
            from .._policies.routing.discovery_config import DiscoveryConfig

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
        #: The latencies that set the hedges' delay, and their budget (used only by
        #: calls with a ``HedgePolicy``; ``_call/hedge_race.py``).
        self.hedging = HedgeState(self.clock)
        self.rng = random.Random()
        self.stats = StatsRecorder()
        #: Which tier each model's calls go to, and what each deployment served.
        self.tier_watch = TierWatch()
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
                affinity=affinity,
                hedge=hedge,
                latency_routing=latency_routing,
            )
        )
        #: Receives every call's events (spans, metrics); None: no events at all.
        self.observer = telemetry
        #: The observer's cheap "this call would record nothing" (``Telemetry.quiet``),
        #: asked before a call's start event is built; None: an observer without one.
        quiet = getattr(telemetry, "quiet", None)
        self.observer_quiet: Callable[[], bool] | None = quiet if callable(quiet) else None
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
        #: Which endpoints are in rotation (``_policies/routing/ejection.py``); None when
        #: turned off.
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
        if quota is not None and not isinstance(quota, QuotaPolicy):
            raise TypeError(
                f"quota must be a stormguard.QuotaPolicy or None, got {type(quota).__name__}"
            )
        #: The quotas of the keys this client's calls use (None: turned off).
        self.quota = None if quota is None else QuotaGate(quota, self.clock)
        #: The service a call's key belongs to, when it goes to the client's endpoints.
        self.quota_host = first.netloc.decode("ascii")
        #: ``server.address`` / ``server.port`` of the call spans.
        self.server_address: str | None = first.host or None
        self.server_port: int | None = first.port or (443 if first.scheme == "https" else 80)
        on_discovery = (self._discovered, *discovery_listeners)
        endpoints_discovered = getattr(telemetry, "endpoints_discovered", None)
        if callable(endpoints_discovered):  # an observer written before discovery has none
            on_discovery += (endpoints_discovered,)
        #: The DNS names this client follows (``_policies/routing/discovery.py``); None: no
        #: DNS name.
        self.discovery: Discovery | None = None
        if discovered:
            from .._policies.routing.discovery import Discovery

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

    def _discovered(self, change: DiscoveryChange) -> None:
        """Addresses that left a DNS name take their breakers and concurrency limits
        with them (a limit in use once its calls are done): a name whose pods move
        at every deploy leaves no state behind."""
        if change.removed:
            if self.breakers is not None:
                self.breakers.forget(change.removed)
            if self.limiter is not None:
                self.limiter.forget(change.removed)

    def netlocs(self) -> set[str]:
        """``host:port`` of every endpoint, and of every DNS name as written."""
        ours = {httpx.URL(state.base_url).netloc.decode("ascii") for state in self.picker.states}
        if self.discovery is not None:
            ours |= self.discovery.netlocs()
        return ours
