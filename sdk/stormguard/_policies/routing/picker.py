"""Several servers behind one client: which one gets the next attempt.

Power of two choices on the freshest load each server reported (Finagle's and
Envoy's least-loaded balancer, fed by the protocol's load headers): draw two
healthy endpoints at random (by weight), send to the less loaded. Two random
choices avoid both the herd that "always the least loaded" creates when every
client sees the same stale figure, and the blindness of plain random.

An endpoint's load is the attempts this client has in flight to it (a stream
until its end: ``_call/attempt_record.py`` holds a successful stream's place
until ``release_slot``), plus —
while its last report is fresh (``stale_after``, 5 s) — the server's
``x-queue-depth`` and its in-flight token share (``x-inflight-tokens`` /
``x-token-capacity``). A stale report is ignored rather than trusted: a
server that was busy ten seconds ago may be idle now, and one that stopped
answering has no fresh report at all. Load divides by weight.

**Latency-aware choice** (``LatencyRouting``, off unless given): the two are
compared by peak EWMA's cost, ``(load + 1) * latency estimate``, where the
estimate is how fast the endpoint has answered this client lately (a stream's
first chunk, a plain call's time per token; ``_policies/routing/peak_ewma.py``).
Load alone cannot see a replica slowed by someone else's calls; its answers can.

**Pools by class.** An endpoint may serve only some priority classes (the
``x-priority`` values: ``critical``, ``standard``, ``sheddable``), so batch work
cannot take an interactive replica: a call goes to the endpoints of its own
class, and to another pool's only when ``SpillOver`` allows its class and that
endpoint's fresh load report shows headroom (no shed, no queue, token and KV
use under a share). No fresh report is no headroom: an endpoint this client
has not heard from lately may be full.

**Prefix-cache affinity.** A call with an affinity key (``_policies/routing/affinity.py``)
goes first, within its own pool's best tier, to the key's endpoint by rendezvous
hashing with bounded loads, skipping one that sheds or that a retry avoids; the
rest follow in the order above. When none of the key's endpoints fits, the call
goes by load as one without a key. A key whose home was full moves with the call
that left it: its later calls go first to that endpoint, which now holds its
newest prefix, and load that piles up on one replica drains off by moving keys
instead of by one call of many keys after another (each paying its whole prefix
again on the other replica).

The set of endpoints may change (DNS discovery, ``_policies/routing/discovery.py``): ``replace``
swaps it at once, keeping the ``EndpointState`` of every endpoint that stays.

This module holds ``EndpointPicker``: the choice itself and the set it chooses
from. ``Endpoint``, ``SpillOver`` and their checks are ``_policies/routing/endpoint_config.py``,
one endpoint's live state ``_policies/routing/endpoint_state.py``, and the base URL helpers
(``dns+``, ``host:port``) ``_policies/routing/base_url.py``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence

from ..._core.clock import Clock
from ..._core.fork import forget_in_child, fork_safe_lock
from ...protocol import Priority, ServerLoad
from .affinity import DEFAULT_EPSILON, DEFAULT_SLACK, affinity_choice
from .endpoint_config import Endpoint as Endpoint
from .endpoint_config import SpillOver as SpillOver
from .endpoint_config import _none_serves
from .endpoint_state import EndpointState as EndpointState
from .latency_config import LatencyRouting
from .peak_ewma import peak_cost

__all__ = ["DEFAULT_STALE_AFTER", "EndpointPicker", "Ranked"]


DEFAULT_STALE_AFTER = 5.0
#: Affinity keys a picker remembers as moved off their home (a key is 16 bytes:
#: about 1 MB at most). A key it forgets goes home, and moves again if home is full.
MOVED_KEYS = 8192


#: The endpoints to try, in order, and the affinity key's home among them (the first
#: of its ranking; None: no key, or no choice to make). A plain tuple: one is made
#: for every attempt of every call.
Ranked = tuple[list[EndpointState], "EndpointState | None"]
#: What endpoints are ranked by, lower first (``EndpointPicker._rank``): peak EWMA's
#: cost (0 without ``LatencyRouting``), whether its estimate is known, the load.
Rank = tuple[float, bool, float]


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
        self._lock = fork_safe_lock()
        #: Affinity keys that moved off a full home: the endpoint each moved to, the
        #: least recently moved first (``MOVED_KEYS`` at most).
        self._moves: OrderedDict[bytes, str] = OrderedDict()
        #: Keys for the streams waiting for a first chunk (``wait_began``).
        self._wait_keys = itertools.count()
        forget_in_child(self)

    def _forget_parent_calls(self) -> None:
        """In a forked child: the parent's attempts in flight will never end here
        (``_core/fork.py``), and must not make their endpoints look busy."""
        for state in self.states:
            state.in_flight = 0
            state.waiting = None

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
        affinity_key: bytes | None = None,
        epsilon: float = DEFAULT_EPSILON,
        slack: int = DEFAULT_SLACK,
        latency: LatencyRouting | None = None,
        stream: bool = False,
    ) -> list[EndpointState]:
        """Usable endpoints serving ``model`` for ``priority`` in the order to try
        them: of the call's own pool, the power-of-two-choices winner first, then the
        rest by load; then, the same way, the other pools' endpoints that ``spill``
        lets it use. Those in ``avoid`` (endpoints a retry has tried already) go last
        in their pool while another usable one exists. With deployments of several
        tiers, tier by tier (1 first), each in that order. With an ``affinity_key``,
        the key's endpoint (bounded loads with ``epsilon`` and ``slack``) comes first in the own
        pool's best tier (``choose``). With ``latency``, endpoints are ranked by peak
        EWMA's cost, ``(load + 1) * latency estimate`` of the call's kind (a
        ``stream``'s first chunk, or a plain call's time per token), instead of by
        load (``_policies/routing/peak_ewma.py``)."""
        return self.choose(
            model=model,
            priority=priority,
            spill=spill,
            avoid=avoid,
            usable=usable,
            affinity_key=affinity_key,
            epsilon=epsilon,
            slack=slack,
            latency=latency,
            stream=stream,
        )[0]

    def choose(
        self,
        *,
        model: str | None = None,
        priority: Priority | None = None,
        spill: SpillOver | None = None,
        avoid: str | Collection[str] | None = None,
        usable: Callable[[EndpointState], bool] = lambda s: True,
        affinity_key: bytes | None = None,
        epsilon: float = DEFAULT_EPSILON,
        slack: int = DEFAULT_SLACK,
        latency: LatencyRouting | None = None,
        stream: bool = False,
    ) -> Ranked:
        """``candidates``, with the affinity key's home (``Ranked``)."""
        states = self.states
        if len(states) == 1:
            # One endpoint (the common client): no pool to split, nothing to rank.
            state = states[0]
            if not (state.serves(model) and state.serves_class(priority)):
                raise ValueError(_none_serves(model, priority))
            return ([state] if usable(state) else []), None
        own, others = self._pools(model, priority, spill)
        avoided = {avoid} if isinstance(avoid, str) else set(avoid or ())
        # Outside the lock: ``usable`` may probe.
        usable_own = [s for s in own if usable(s)]
        usable_others = [s for s in others if usable(s)]
        if not usable_others and len(usable_own) <= 1:
            # One endpoint (the common client) or none: no order to find.
            return usable_own, None
        tiers = sorted({s.tier for s in usable_own} | {s.tier for s in usable_others})
        home: EndpointState | None = None
        keyed = affinity_key is not None
        with self._lock:
            now = self._clock.now()
            ordered: list[EndpointState] = []
            for tier in tiers:
                own_tier = [s for s in usable_own if s.tier == tier]
                if keyed and own_tier:
                    keyed = False  # the own pool's best tier only
                    assert affinity_key is not None
                    home, first = self._by_affinity(
                        own_tier, affinity_key, (epsilon, slack), avoided, now, latency, stream
                    )
                    ordered += first
                else:
                    rank = self._rank(own_tier, now, latency, stream)
                    ordered += self._ordered(own_tier, avoided, rank)
                others_tier = [s for s in usable_others if s.tier == tier]
                ordered += self._ordered(
                    others_tier, avoided, self._rank(others_tier, now, latency, stream)
                )
            return ordered, home

    def _rank(
        self,
        states: list[EndpointState],
        now: float,
        latency: LatencyRouting | None,
        stream: bool,
    ) -> Callable[[EndpointState], Rank]:
        """The key ``states`` are ranked by (lower is better): their load per unit of
        weight (``EndpointState.score``); with ``latency``, peak EWMA's cost first,
        an endpoint without an estimate taken as the fastest of ``states`` and
        going first among equal costs, so that each is tried early (with no
        estimate among them, load alone)."""
        stale = self._stale_after
        if latency is None or len(states) <= 1:
            return lambda s: (0.0, False, s.score(now, stale))
        decay = latency.decay
        estimates = {s: s.latency(stream, now, decay) for s in states}
        known = [e for e in estimates.values() if e is not None]
        if not known:
            return lambda s: (0.0, False, s.score(now, stale))
        fastest = min(known)

        def key(s: EndpointState) -> Rank:
            score = s.score(now, stale)
            estimate = estimates.get(s)
            if estimate is None:
                return peak_cost(score, s.weight, fastest), False, score
            return peak_cost(score, s.weight, estimate), True, score

        return key

    def _by_affinity(
        self,
        states: list[EndpointState],
        key: bytes,
        bound: tuple[float, int],
        avoided: set[str],
        now: float,
        latency: LatencyRouting | None,
        stream: bool,
    ) -> tuple[EndpointState | None, list[EndpointState]]:
        """The key's home among ``states`` and ``states`` in order: the key's choice
        first (neither avoided nor shedding, within its load bound), the rest by
        ``_rank``; with no choice, the order without a key."""
        rank = self._rank(states, now, latency, stream)
        if len(states) <= 1:
            return None, self._ordered(states, avoided, rank)

        def skip(state: EndpointState) -> bool:
            return state.name in avoided or state.shedding(now, self._stale_after)

        moves = self._moves
        home, chosen = affinity_choice(
            key, states, epsilon=bound[0], slack=bound[1], skip=skip, moved=moves.get(key)
        )
        if chosen is not None and chosen is not home and not skip(home):
            # Its home was full: the key moves to where this call goes, and its
            # later calls follow the prefix there (``MOVED_KEYS``).
            moves[key] = chosen.name
            moves.move_to_end(key)
            if len(moves) > MOVED_KEYS:
                moves.popitem(last=False)
        if chosen is None:
            return home, self._ordered(states, avoided, rank)
        rest = sorted(
            (s for s in states if s is not chosen), key=lambda s: (s.name in avoided, rank(s))
        )
        return home, [chosen, *rest]

    def _ordered(
        self,
        usable_states: list[EndpointState],
        avoided: set[str],
        rank: Callable[[EndpointState], Rank],
    ) -> list[EndpointState]:
        preferred = [s for s in usable_states if s.name not in avoided] or usable_states
        if len(preferred) <= 1:
            first = preferred
        else:
            a, b = self._two_by_weight(preferred)
            first = [a if rank(a) <= rank(b) else b]
        rest = sorted(
            (s for s in usable_states if s not in first),
            key=lambda s: (s.name in avoided, rank(s)),
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

    def wait_began(self, state: EndpointState, since: float) -> int:
        """A stream sent to ``state`` at ``since`` (the clock's reading just before)
        waits for its first chunk; returns its key for ``wait_ended``. While it waits,
        ``state``'s first-chunk estimate is at least its wait (``EndpointState.latency``).
        Kept only with ``LatencyRouting`` on."""
        with self._lock:
            key = next(self._wait_keys)
            waiting = state.waiting
            if waiting is None:
                waiting = state.waiting = OrderedDict()
            waiting[key] = since  # sent in order: the first is the oldest
            return key

    def wait_ended(self, state: EndpointState, key: int) -> None:
        """The stream of ``key`` has its first chunk, or ended without one."""
        with self._lock:
            if state.waiting is not None:
                state.waiting.pop(key, None)

    def observe_latency(
        self,
        state: EndpointState,
        seconds: float,
        latency: LatencyRouting,
        *,
        stream: bool,
        lower_bound: bool = False,
    ) -> None:
        """Add a latency sample of ``state`` (``peak_ewma.py`` says which): a stream's
        time to its first chunk, a plain call's seconds per completion token; a
        ``lower_bound`` when the attempt ended before its answer."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        with self._lock:
            state.observe_latency(
                seconds, self._clock.now(), latency.decay, stream=stream, lower_bound=lower_bound
            )

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
        raise ValueError(
            f"endpoint names must be unique, got {names}: give each Endpoint or Deployment"
            " of one host a name= of its own"
        )
