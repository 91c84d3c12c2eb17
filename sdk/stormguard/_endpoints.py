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
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from ._clock import Clock
from ._redact import display_url
from .protocol import ServerLoad

if TYPE_CHECKING:
    from ._ejection import _Record

__all__ = [
    "DEFAULT_STALE_AFTER",
    "Endpoint",
    "EndpointPicker",
    "EndpointState",
    "normalize_base_url",
]

DEFAULT_STALE_AFTER = 5.0


def normalize_base_url(base_url: str | httpx.URL) -> tuple[str, str]:
    """``(base_url without trailing slash, "host:port")``; ValueError for a non-HTTP URL."""
    url = httpx.URL(str(base_url))
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http(s) URL, got {display_url(url)[:200]!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    return str(url).rstrip("/"), f"{url.host}:{port}"


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

    def __post_init__(self) -> None:
        if not (self.weight > 0 and self.weight < float("inf")):
            raise ValueError(f"endpoint weight must be a positive number, got {self.weight!r}")
        if self.models is not None:
            if isinstance(self.models, str):
                raise TypeError("models must be a collection of model names, not one string")
            object.__setattr__(self, "models", frozenset(self.models))

    def __repr__(self) -> str:
        # Never a password in the URL (http://user:KEY@host).
        return (
            f"Endpoint(base_url={display_url(self.base_url)!r}, weight={self.weight!r},"
            f" name={self.name!r}, models={self.models!r})"
        )


class EndpointState:
    """What the client knows of one endpoint right now: the one place its per-endpoint
    state lives (load, attempts in flight, ejection), so that a changing list of
    endpoints keeps each one's state for as long as the endpoint stays in it."""

    __slots__ = (
        "base_url",
        "ejection",
        "in_flight",
        "load",
        "load_at",
        "models",
        "name",
        "weight",
    )

    def __init__(self, endpoint: Endpoint) -> None:
        self.base_url, default_name = normalize_base_url(endpoint.base_url)
        self.name = endpoint.name or default_name
        self.weight = endpoint.weight
        self.models = None if endpoint.models is None else frozenset(endpoint.models)
        self.in_flight = 0
        self.load: ServerLoad | None = None
        self.load_at = float("-inf")
        #: Its ejection record (``_ejection.py``), made on first use.
        self.ejection: _Record | None = None

    def serves(self, model: str | None) -> bool:
        return self.models is None or model is None or model in self.models

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
    """Thread-safe endpoint choice for one client."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        clock: Clock,
        rng: random.Random,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        self.states = [EndpointState(e) for e in endpoints]
        names = [s.name for s in self.states]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")
        self._clock = clock
        self._rng = rng
        self._stale_after = stale_after
        self._lock = threading.Lock()

    def serving(self, model: str | None) -> list[EndpointState]:
        """The endpoints that serve ``model``; ValueError when none does (a
        configuration mistake, better said before any request than as a 404)."""
        states = [s for s in self.states if s.serves(model)]
        if not states:
            raise ValueError(f"no endpoint of this client serves model {model!r}")
        return states

    def candidates(
        self,
        *,
        model: str | None = None,
        avoid: str | Collection[str] | None = None,
        usable: Callable[[EndpointState], bool] = lambda s: True,
    ) -> list[EndpointState]:
        """Usable endpoints serving ``model`` in the order to try them: the
        power-of-two-choices winner first, then the rest by load. Those in ``avoid``
        (endpoints a retry has tried already) go last while another usable one exists."""
        serving = self.serving(model)
        avoided = {avoid} if isinstance(avoid, str) else set(avoid or ())
        usable_states = [s for s in serving if usable(s)]  # outside the lock: it may probe
        with self._lock:
            now = self._clock.now()
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
