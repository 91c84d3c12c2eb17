"""``EndpointState``: the live state of one endpoint (its load, its attempts in
flight, its ejection record) and the score the picker ranks it by."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from ...protocol import Priority, ServerLoad
from .base_url import normalize_base_url
from .deployment import Deployment
from .endpoint_config import Endpoint, priority_classes
from .peak_ewma import PeakEwma

if TYPE_CHECKING:
    from .ejection_status import _Record

__all__ = ["EndpointState"]


class EndpointState:
    """What the client knows of one endpoint right now: the one place its per-endpoint
    state lives (load, attempts in flight, ejection), so that a changing list of
    endpoints keeps each one's state for as long as the endpoint stays in it."""

    __slots__ = (
        "authority",
        "base_url",
        "classes",
        "ejection",
        "first_chunk_latency",
        "in_flight",
        "load",
        "load_at",
        "models",
        "name",
        "provider",
        "server_hostname",
        "tier",
        "token_latency",
        "waiting",
        "weight",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        authority: str | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.base_url, default_name = normalize_base_url(endpoint.base_url)
        self.name = endpoint.name or default_name
        self.weight = endpoint.weight
        self.models = None if endpoint.models is None else frozenset(endpoint.models)
        self.classes = None if endpoint.classes is None else priority_classes(endpoint.classes)
        #: Its provider's settings (credential, model names, query) when it is a
        #: ``Deployment``; None: a plain endpoint, which sends the client's.
        self.provider: Deployment | None = None
        #: Its tier (1 is preferred; a plain endpoint is of tier 1).
        self.tier = 1
        if isinstance(endpoint, Deployment):
            self.provider = endpoint
            self.tier = endpoint.tier
        #: The ``Host`` header to send instead of the URL's (a discovered address
        #: keeps its service's name, as gRPC keeps the target's authority).
        self.authority = authority
        #: The name TLS checks the certificate against (https to a discovered address).
        self.server_hostname = server_hostname
        self.in_flight = 0
        self.load: ServerLoad | None = None
        self.load_at = float("-inf")
        #: Its latency estimates (``_policies/routing/peak_ewma.py``): a stream's time
        #: to its first chunk, a plain call's latency per completion token; None
        #: until a sample of that kind (fed only with ``LatencyRouting`` on).
        self.first_chunk_latency: PeakEwma | None = None
        self.token_latency: PeakEwma | None = None
        #: When each of this client's streams to it that has no first chunk yet was
        #: sent, oldest first, by the picker's key for the attempt; None until the
        #: first (kept only with ``LatencyRouting`` on).
        self.waiting: OrderedDict[int, float] | None = None
        #: Its ejection record (``_Record``, ``_policies/routing/ejection_status.py``),
        #: made by the tracker (``_policies/routing/ejection.py``) on first use.
        self.ejection: _Record | None = None

    def serves(self, model: str | None) -> bool:
        return self.models is None or model is None or model in self.models

    def serves_class(self, priority: Priority | None) -> bool:
        return self.classes is None or priority is None or priority in self.classes

    def url_for(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def score(self, now: float, stale_after: float) -> float:
        """Estimated load per unit of weight (lower is better)."""
        score = float(self.in_flight)
        load = self.load
        if load is not None and now - self.load_at <= stale_after:
            score += load.queue_depth or 0
            if load.inflight_tokens is not None and load.token_capacity:
                score += load.inflight_tokens / load.token_capacity
        return score / self.weight

    def latency(self, stream: bool, now: float, decay: float) -> float | None:
        """Its latency estimate for a call of this kind now (None: no sample yet). A
        stream's is at least how long its oldest stream still without a first chunk
        has waited: that first chunk will take longer (``peak_ewma.py``)."""
        ewma = self.first_chunk_latency if stream else self.token_latency
        estimate = None if ewma is None else ewma.estimate(now, decay)
        waiting = self.waiting
        if stream and waiting:
            waited = now - next(iter(waiting.values()))
            if estimate is None or waited > estimate:
                return waited
        return estimate

    def observe_latency(
        self, seconds: float, now: float, decay: float, *, stream: bool, lower_bound: bool
    ) -> None:
        """Add a latency sample of this kind (``PeakEwma.observe``); a first one that is
        only a lower bound starts the estimate all the same."""
        ewma = self.first_chunk_latency if stream else self.token_latency
        if ewma is not None:
            ewma.observe(seconds, now, decay, lower_bound=lower_bound)
        elif stream:
            self.first_chunk_latency = PeakEwma(seconds, now)
        else:
            self.token_latency = PeakEwma(seconds, now)

    def shedding(self, now: float, stale_after: float) -> bool:
        """Whether its freshest load report came with a shed (``x-load-shed``): the
        server says it has no room."""
        load = self.load
        return load is not None and now - self.load_at <= stale_after and bool(load.load_shed)

    def __repr__(self) -> str:
        return f"EndpointState({self.name!r}, in_flight={self.in_flight})"
