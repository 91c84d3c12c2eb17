"""What a client's calls send and how long they may take (``ClientSettings``): its
``CallSettings`` applied as headers, timeouts, models and priority, and ``derive``,
which ``with_options`` changes them with. The part of ``ClientCore`` that a
derived client does not share with its parent.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._core.compat import Self
from .._core.redact import Redactor
from .._io.body import ACCEPT_ENCODING
from .._policies.fallback import Fallbacks
from .._policies.hedge.policy import checked_hedge
from .._policies.retry.retry import RetryPolicy
from .._policies.routing.affinity_config import checked_affinity
from .._policies.routing.deployment import Deployment, is_account_header
from .._policies.routing.endpoint_config import Endpoint, check_served
from .._policies.routing.latency_config import checked_latency
from .._version import __version__
from ..protocol import (
    HEADER_ENDPOINT_LOAD_METRICS_FORMAT,
    HEADER_PRIORITY,
    Priority,
    parse_priority,
)
from .arguments import CallSettings, checked_stream_timeouts
from .openai_conventions import (
    NOT_GIVEN,
    AttemptTimeouts,
    NotGiven,
    check_timeout,
    drop_omitted,
    retry_policy_from,
    split_timeout,
)

if TYPE_CHECKING:
    from .._core.clock import Clock
    from .._policies.quota import QuotaKey

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "ClientSettings"]

DEFAULT_CONNECT_TIMEOUT = 10.0
#: Deployments whose headers a client keeps at hand (past them, it starts again).
_MAX_PROVIDERS = 256


class ClientSettings:
    """The settings of one client's calls, resolved; ``ClientCore`` builds on it and
    sets ``endpoints``, ``clock`` and ``several_endpoints`` before it applies the
    first ``CallSettings``."""

    endpoints: list[Endpoint]
    clock: Clock
    #: More than one endpoint, or a DNS name that may stand for several: only then
    #: is a call's affinity key worth reading, or a hedge possible.
    several_endpoints: bool

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
        #: Where a call goes when its model refuses it, by why (``_policies/fallback.py``).
        self.fallbacks = Fallbacks.of(settings.fallback_models)
        self.fallback_models = self.fallbacks.models
        #: First-chunk, idle and overall bounds of every stream (None: the timeout only).
        self.stream_timeouts = checked_stream_timeouts(settings.stream_timeouts)
        #: Prefix-cache affinity (None: turned off).
        self.affinity = checked_affinity(settings.affinity)
        #: The policy that reads each call's affinity key: None with one endpoint,
        #: where there is no choice to make (and nothing to compute).
        self.affinity_keys = self.affinity if self.several_endpoints else None
        #: Hedged requests (None: turned off), and the policy each call takes: None
        #: with one endpoint, where a hedge has nowhere else to go.
        self.hedge = checked_hedge(settings.hedge)
        self.hedge_calls = self.hedge if self.several_endpoints else None
        #: Latency-aware choice (None: turned off, or one endpoint: no choice to make,
        #: and no sample worth taking).
        latency = checked_latency(settings.latency_routing)
        self.latency_routing = latency if self.several_endpoints else None
        default_headers = drop_omitted(settings.default_headers or {})
        priority = settings.priority
        #: The class of the client's calls (its ``x-priority``), which picks their pool.
        self.priority = (
            Priority(priority)
            if priority is not None
            else parse_priority({k.lower(): v for k, v in default_headers.items()})
        )
        for served in (self.model, *self.fallbacks.all_models()):
            # A clear error now for a model, or a class, that no endpoint serves.
            check_served(self.endpoints, served, self.priority)
        headers = {
            "accept": "application/json",
            # Only what is decoded in bounded steps (``_io/body.py``): a gzip bomb stops at the cap.
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
        #: The quota key of each model called with these settings' credential
        #: (``_call/call_quota.py``): a call finds its key with one look-up.
        self.quota_keys: dict[str, QuotaKey] = {}
        #: Query parameters of every request (``extra_query`` adds to them per call).
        self.default_query: Mapping[str, object] = drop_omitted(settings.default_query or {})
        #: Scrubs the credentials this client sends (headers, base URLs, every
        #: deployment's) from what it shows.
        self.redactor = Redactor.for_client(
            headers=headers,
            urls=[endpoint.base_url for endpoint in self.endpoints],
            more_headers=[e.sent_headers() for e in self.endpoints if isinstance(e, Deployment)],
        )
        self._provider_headers: dict[Deployment, dict[str, str]] = {}

    def derive(self, changes: Mapping[str, Any]) -> Self:
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

    def provider_headers(self, provider: Deployment) -> Mapping[str, str]:
        """The headers every attempt to ``provider`` starts from: the client's without
        its credential and account headers (a key for one provider is never sent to
        another), and the deployment's own. One dict per deployment and settings,
        never changed once made (the pool caches what it builds from it)."""
        base = self._provider_headers.get(provider)
        if base is None:
            if len(self._provider_headers) >= _MAX_PROVIDERS:
                self._provider_headers.clear()
            base = {k: v for k, v in self.headers.items() if not is_account_header(k)}
            base.update(provider.sent_headers())
            self._provider_headers[provider] = base
        return base

    def attempt_timeout(
        self, remaining: float, limits: AttemptTimeouts | None = None
    ) -> dict[str, float | None]:
        """The timeouts of one attempt (the ``timeout`` request extension): each
        operation may take what is left, and no more than its bound (the call's own
        ``Timeout``, else the client's)."""
        return (limits or self.attempt_timeouts).for_attempt(remaining)
