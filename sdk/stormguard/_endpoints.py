"""Several servers behind one client: which one gets the next attempt.

Power of two choices on the freshest load each server reported (Finagle's and
Envoy's least-loaded balancer, fed by the protocol's load headers): draw two
healthy endpoints at random (by weight), send to the less loaded. Two random
choices avoid both the herd that "always the least loaded" creates when every
client sees the same stale figure, and the blindness of plain random.

An endpoint's load is the attempts this client has in flight to it, plus —
while its last report is fresh (``stale_after``, 5 s) — the server's
``x-queue-depth`` and its in-flight token share (``x-inflight-tokens`` /
``x-token-capacity``). A stale report is ignored rather than trusted: a
server that was busy ten seconds ago may be idle now, and one that stopped
answering has no fresh report at all. Load divides by weight.

**Pools by class.** An endpoint may serve only some priority classes (the
``x-priority`` values: ``critical``, ``standard``, ``sheddable``), so batch work
cannot take an interactive replica: a call goes to the endpoints of its own
class, and to another pool's only when ``SpillOver`` allows its class and that
endpoint's fresh load report shows headroom (no shed, no queue, token and KV
use under a share). No fresh report is no headroom: an endpoint this client
has not heard from lately may be full.

The set of endpoints may change (DNS discovery, ``_discovery.py``): ``replace``
swaps it at once, keeping the ``EndpointState`` of every endpoint that stays.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._clock import Clock
from ._http import httpx
from ._redact import display_url
from .protocol import Priority, ServerLoad

if TYPE_CHECKING:
    from ._ejection import _Record

__all__ = [
    "DEFAULT_STALE_AFTER",
    "DNS_SCHEME_PREFIX",
    "Endpoint",
    "EndpointPicker",
    "EndpointState",
    "SpillOver",
    "check_served",
    "normalize_base_url",
    "priority_classes",
    "split_dns_scheme",
]

DEFAULT_STALE_AFTER = 5.0
#: A base URL to follow in DNS (``dns+http://name:port/v1``): ``_discovery.py``.
DNS_SCHEME_PREFIX = "dns+"


def split_dns_scheme(url: str) -> tuple[str, bool]:
    """``(url without "dns+", whether it had it)``. Here, not in ``_discovery``, so
    that a client with no DNS name never loads discovery."""
    if url[: len(DNS_SCHEME_PREFIX)].lower() == DNS_SCHEME_PREFIX:
        return url[len(DNS_SCHEME_PREFIX) :], True
    return url, False


def normalize_base_url(base_url: str | httpx.URL) -> tuple[str, str]:
    """``(base_url without trailing slash, "host:port")``; ValueError for a non-HTTP URL."""
    url = httpx.URL(str(base_url))
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http(s) URL, got {display_url(url)[:200]!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    return str(url).rstrip("/"), f"{url.host}:{port}"


def priority_classes(classes: Collection[Priority | str]) -> frozenset[Priority]:
    """The priority classes named in ``classes``; a clear error for anything else."""
    if isinstance(classes, str):
        raise TypeError("classes must be a collection of priority classes, not one string")
    found: set[Priority] = set()
    for value in classes:
        try:
            found.add(Priority(value))
        except ValueError:
            valid = ", ".join(p.value for p in Priority)
            raise ValueError(
                f"a class is an x-priority value ({valid}), got {str(value)[:50]!r}"
            ) from None
    if not found:
        raise ValueError("classes is empty: give at least one class, or None for every class")
    return frozenset(found)


@dataclass(frozen=True)
class Endpoint:
    """One server the client may send to.

    >>> Endpoint("http://10.0.0.5:8000/v1", weight=2.0).weight
    2.0
    """

    base_url: str
    weight: float = 1.0
    #: Shown in attempt records, breaker names and stats; ``host:port`` by default.
    name: str | None = None
    #: The models this server serves (None: any). A call goes only to endpoints that
    #: serve its model, so a fallback model can live on another pool of servers.
    models: Collection[str] | None = None
    #: The priority classes it serves (``x-priority`` values; None: every class). A
    #: call goes to the endpoints of its own class (``SpillOver`` for the exception).
    classes: Collection[Priority | str] | None = None

    def __post_init__(self) -> None:
        if not (self.weight > 0 and self.weight < float("inf")):
            raise ValueError(f"endpoint weight must be a positive number, got {self.weight!r}")
        if self.models is not None:
            if isinstance(self.models, str):
                raise TypeError("models must be a collection of model names, not one string")
            object.__setattr__(self, "models", frozenset(self.models))
        if self.classes is not None:
            object.__setattr__(self, "classes", priority_classes(self.classes))

    def serves(self, model: str | None, priority: Priority | None = None) -> bool:
        return (self.models is None or model is None or model in self.models) and (
            self.classes is None or priority is None or priority in self.classes
        )

    def __repr__(self) -> str:
        # Never a password in the URL (http://user:KEY@host).
        classes = None if self.classes is None else sorted(Priority(c).value for c in self.classes)
        return (
            f"Endpoint(base_url={display_url(self.base_url)!r}, weight={self.weight!r},"
            f" name={self.name!r}, models={self.models!r}, classes={classes!r})"
        )


def check_served(
    endpoints: Sequence[Endpoint], model: str | None, priority: Priority | None = None
) -> None:
    """ValueError when no endpoint serves ``model`` for ``priority``: a configuration
    mistake, better said when the client is made than as a 404 or an empty pool."""
    if not any(e.serves(model, priority) for e in endpoints):
        raise ValueError(_none_serves(model, priority))


def _none_serves(model: str | None, priority: Priority | None) -> str:
    served = f"no endpoint of this client serves model {model!r}"
    return served if priority is None else f"{served} for priority class {priority.value!r}"


@dataclass(frozen=True)
class SpillOver:
    """When a call may use another class's endpoints: only calls of ``classes``
    (``sheddable`` by default: batch work onto the interactive pool), only when no
    endpoint of their own class has a free slot, and only on an endpoint whose load
    report, at most ``stale_after`` old (5 s), shows headroom: no shed, at most
    ``max_queue_depth`` requests waiting (0), in-flight tokens under
    ``max_token_share`` of its capacity and KV-cache use under ``max_kv_cache_usage``
    (0.8 each: the saturation point llm-d's scheduler uses for KV).

    >>> SpillOver(classes={"sheddable", "standard"}).max_queue_depth
    0
    """

    classes: Collection[Priority | str] = (Priority.SHEDDABLE,)
    max_queue_depth: int = 0
    max_token_share: float = 0.8
    max_kv_cache_usage: float = 0.8

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", priority_classes(self.classes))
        depth = self.max_queue_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"max_queue_depth must be an integer >= 0, got {depth!r}")
        for name in ("max_token_share", "max_kv_cache_usage"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0.0 < value <= 1.0)
            ):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")

    def allows(self, priority: Priority) -> bool:
        return priority in self.classes

    def headroom(self, load: ServerLoad | None) -> bool:
        """Whether a (fresh) load report says the server has room for more."""
        if load is None or load.load_shed or load.queue_depth is None:
            return False
        if load.queue_depth > self.max_queue_depth:
            return False
        tokens, capacity = load.inflight_tokens, load.token_capacity
        if tokens is not None and capacity and tokens >= self.max_token_share * capacity:
            return False
        return load.kv_cache_usage is None or load.kv_cache_usage < self.max_kv_cache_usage


class EndpointState:
    """What the client knows of one endpoint right now: the one place its per-endpoint
    state lives (load, attempts in flight, ejection), so that a changing list of
    endpoints keeps each one's state for as long as the endpoint stays in it."""

    __slots__ = (
        "authority",
        "base_url",
        "classes",
        "ejection",
        "in_flight",
        "load",
        "load_at",
        "models",
        "name",
        "server_hostname",
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
        #: The ``Host`` header to send instead of the URL's (a discovered address
        #: keeps its service's name, as gRPC keeps the target's authority).
        self.authority = authority
        #: The name TLS checks the certificate against (https to a discovered address).
        self.server_hostname = server_hostname
        self.in_flight = 0
        self.load: ServerLoad | None = None
        self.load_at = float("-inf")
        #: Its ejection record (``_ejection.py``), made on first use.
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

    def shedding(self, now: float, stale_after: float) -> bool:
        """Whether its freshest load report came with a shed (``x-load-shed``): the
        server says it has no room."""
        load = self.load
        return load is not None and now - self.load_at <= stale_after and bool(load.load_shed)

    def __repr__(self) -> str:
        return f"EndpointState({self.name!r}, in_flight={self.in_flight})"


class EndpointPicker:
    """Thread-safe endpoint choice for one client, over a set of endpoints that
    ``replace`` may change (empty only until a discovered set first arrives)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        clock: Clock,
        rng: random.Random,
        stale_after: float = DEFAULT_STALE_AFTER,
        discovered: bool = False,
    ) -> None:
        if not endpoints and not discovered:
            raise ValueError("at least one endpoint is needed")
        #: The endpoints now: a list replaced whole, never changed in place, so a
        #: reader that took it sees one consistent set.
        self.states: list[EndpointState] = [EndpointState(e) for e in endpoints]
        _check_unique(self.states)
        self._clock = clock
        self._rng = rng
        self._stale_after = stale_after
        self._lock = threading.Lock()

    def replace(self, states: Sequence[EndpointState]) -> tuple[list[str], list[str]]:
        """Make ``states`` the set, at once; returns the names added and removed. An
        endpoint whose name is already in the set keeps its state object (load,
        ejection; the breakers and limits keyed by its name keep theirs); one that
        left is no longer chosen, and its attempts in flight finish as they would."""
        _check_unique(states)
        with self._lock:
            current = {s.name: s for s in self.states}
            kept = [current.get(s.name, s) for s in states]
            names = {s.name for s in kept}
            added = [s.name for s in kept if s.name not in current]
            removed = [name for name in current if name not in names]
            self.states = kept
        return added, removed

    def serving(
        self,
        model: str | None,
        priority: Priority | None = None,
        spill: SpillOver | None = None,
    ) -> list[EndpointState]:
        """The endpoints that serve ``model`` for ``priority``: its own pool, then the
        endpoints of other pools that ``spill`` lets it use now (``SpillOver``).
        ValueError when its own pool is empty (a configuration mistake, better said
        before any request than as a 404)."""
        own, others = self._pools(model, priority, spill)
        return own + others

    def _pools(
        self, model: str | None, priority: Priority | None, spill: SpillOver | None
    ) -> tuple[list[EndpointState], list[EndpointState]]:
        states = self.states
        serving = [s for s in states if s.serves(model)]
        own = [s for s in serving if s.serves_class(priority)]
        if not own:
            raise ValueError(_none_serves(model, priority))
        if spill is None or priority is None or not spill.allows(priority):
            return own, []
        with self._lock:
            now = self._clock.now()
            others = [
                s
                for s in serving
                if not s.serves_class(priority)
                and now - s.load_at <= self._stale_after
                and spill.headroom(s.load)
            ]
        return own, others

    def candidates(
        self,
        *,
        model: str | None = None,
        priority: Priority | None = None,
        spill: SpillOver | None = None,
        avoid: str | Collection[str] | None = None,
        usable: Callable[[EndpointState], bool] = lambda s: True,
    ) -> list[EndpointState]:
        """Usable endpoints serving ``model`` for ``priority`` in the order to try
        them: of the call's own pool, the power-of-two-choices winner first, then the
        rest by load; then, the same way, the other pools' endpoints that ``spill``
        lets it use. Those in ``avoid`` (endpoints a retry has tried already) go last
        in their pool while another usable one exists."""
        own, others = self._pools(model, priority, spill)
        avoided = {avoid} if isinstance(avoid, str) else set(avoid or ())
        # Outside the lock: ``usable`` may probe.
        usable_own = [s for s in own if usable(s)]
        usable_others = [s for s in others if usable(s)]
        with self._lock:
            now = self._clock.now()
            return self._ordered(usable_own, avoided, now) + self._ordered(
                usable_others, avoided, now
            )

    def _ordered(
        self, usable_states: list[EndpointState], avoided: set[str], now: float
    ) -> list[EndpointState]:
        preferred = [s for s in usable_states if s.name not in avoided] or usable_states
        if len(preferred) <= 1:
            first = preferred
        else:
            a, b = self._two_by_weight(preferred)
            score_a, score_b = a.score(now, self._stale_after), b.score(now, self._stale_after)
            first = [a if score_a <= score_b else b]
        rest = sorted(
            (s for s in usable_states if s not in first),
            key=lambda s: (s.name in avoided, s.score(now, self._stale_after)),
        )
        return first + rest

    def shedding(self, state: EndpointState) -> bool:
        """Whether ``state``'s freshest load report says it sheds."""
        with self._lock:
            return state.shedding(self._clock.now(), self._stale_after)

    def _two_by_weight(self, states: list[EndpointState]) -> tuple[EndpointState, EndpointState]:
        first = self._rng.choices(states, weights=[s.weight for s in states])[0]
        others = [s for s in states if s is not first]
        second = self._rng.choices(others, weights=[s.weight for s in others])[0]
        return first, second

    def started(self, state: EndpointState) -> None:
        with self._lock:
            state.in_flight += 1

    def finished(self, state: EndpointState) -> None:
        with self._lock:
            state.in_flight = max(state.in_flight - 1, 0)

    def observe(self, state: EndpointState, load: ServerLoad) -> None:
        """Remember the load a response reported (responses without load headers leave
        the last report in place, ageing)."""
        if load.queue_depth is None and load.inflight_tokens is None:
            return
        with self._lock:
            state.load = load
            state.load_at = self._clock.now()


def _check_unique(states: Sequence[EndpointState]) -> None:
    names = [s.name for s in states]
    if len(set(names)) != len(names):
        raise ValueError(f"endpoint names must be unique, got {names}")
