"""A circuit breaker per (endpoint, model): stop calling a server that keeps failing.

Retries and their budget bound how much extra load one failing call adds; the
breaker stops the first attempts too. The OOM-avalanche incident's stop-loss order takes the
OOM-looping instance out of rotation before anything else can recover: a
server that crashes, restarts cold and crashes again is only kept down by
clients that keep sending it work. An open breaker sends it nothing, and the
half-open probes bring traffic back a little at a time once it is healthy.

The states and their names are resilience4j's (closed, open, half_open), and so
is the split between a failure rate over a window and a slow-call rate.
Defaults, and the reasons for them (docs/breakers.md has the long version):

* Count-based window of the last ``window_size=100`` outcomes, trip at
  ``failure_rate_threshold=0.5`` once ``minimum_calls=50`` are in it:
  resilience4j's window and rate. A window of 20 trips "at 50 %" on noise
  (with 20 % transient errors, ten failures in some 20 consecutive calls in
  14 % of 250-call runs; none in 4,000 simulated runs with 100), while 50 %
  errors still always trip. Count-based, not time-based, because the evidence
  is then the same calls for a quiet client and a busy one: a 10-second time
  window would never reach ``minimum_calls`` for a client calling every few
  seconds, and its breaker could never trip on rate.
* ``consecutive_failures=10``: twice Envoy outlier detection's
  ``consecutive_5xx`` default. It catches a crash before ``minimum_calls``
  are in the window; five in a row happen about once in 3,000 calls at 20 %
  transient errors, ten in a row once in 10^7.
* ``slow_call_duration=None``: off. LLM latency is mostly output length, so no
  default threshold is right; when set, a call longer than it is slow, and
  ``slow_call_rate_threshold=0.8`` of slow calls in the window trips: near all,
  since a mix of long and short generations is normal. Pass time to first
  token for streams.
* ``open_time=5`` s, doubled on each re-trip from half-open, capped at
  ``max_open_time=60`` s, never shorter than the server's ``Retry-After``: the
  server knows when it will be back (the reference server says so from its
  restart and drain times), 5 s costs little when it was a blip, and doubling
  reaches the cap in four re-trips (5, 10, 20, 40, 60). Envoy grows its
  ejection time with each ejection too (``base_ejection_time`` times the
  ejections, up to ``max_ejection_time``). The cap matches
  ``RetryPolicy.max_retry_after``: a server cannot park a client for an hour.
* ``jitter=0.1``: the open time is lengthened by up to 10 %, never shortened
  (so it stays at least the Retry-After). One crash trips every client's
  breaker in the same second; without jitter all of them would probe in the
  same second too (Envoy offers ``max_ejection_time_jitter`` as well).
* ``half_open_calls=2`` concurrent probes, ``half_open_successes=2`` to close;
  any probe failure re-opens. Two, so a still-sick server gets two requests
  per client per open period, not a flood (the OOM-avalanche write-up:
  recover with a small share of traffic after warm-up).

The caller decides what an outcome is: the client reads it from the outcome's
``Verdict`` (``_verdict.classify``: connection errors, timeouts, 5xx but 503,
408; never a shed or a 429), and ``Permit`` records one call's outcome. Every
method is thread-safe and usable from asyncio: one ``threading.Lock``, never
held across I/O, a sleep or a listener.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import random
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._clock import Clock
from ._exceptions import CircuitOpenError
from ._outbox import Outbox
from ._verdict import Verdict, classify

__all__ = [
    "BreakerConfig",
    "BreakerListener",
    "BreakerRegistry",
    "BreakerSnapshot",
    "BreakerTransition",
    "CircuitBreaker",
    "CircuitState",
    "Permit",
    "is_breaker_failure",
]

logger = logging.getLogger(__name__)


class CircuitState(str, enum.Enum):
    """Where a breaker is: calls flow, calls fail fast, or a few probes test the server."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    """When a breaker trips and how it recovers; one template for every (endpoint, model).

    >>> BreakerConfig().successes_to_close
    2
    >>> BreakerConfig(slow_call_duration=30.0, open_time=10.0).max_open_time
    60.0
    """

    #: resilience4j's window of 100 calls. A window of 20 trips "at 50% failures"
    #: on noise: with 20% transient errors some 20 consecutive calls hold ten
    #: failures in 14% of 250-call runs; with 100 calls (rate judged from the 50th)
    #: none did in 4,000 simulated runs of 1,000 calls, while 50% errors always trip.
    window_size: int = 100
    minimum_calls: int = 50
    failure_rate_threshold: float = 0.5
    #: None: only the failure rate trips the breaker. Ten, not Envoy's five: an
    #: endpoint with 20% transient errors would see five in a row about once in
    #: 3,000 calls and be cut off for seconds; ten in a row at 20% is a 1-in-10^7
    #: event, while a real outage still trips it within ten calls.
    consecutive_failures: int | None = 10
    #: Seconds; None: slow calls are not tracked.
    slow_call_duration: float | None = None
    slow_call_rate_threshold: float = 0.8
    open_time: float = 5.0
    max_open_time: float = 60.0
    jitter: float = 0.1
    half_open_calls: int = 2
    #: None: as many as ``half_open_calls``.
    half_open_successes: int | None = None

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be at least 1, got {self.window_size}")
        if not 1 <= self.minimum_calls <= self.window_size:
            raise ValueError("minimum_calls must be between 1 and window_size")
        for name in ("failure_rate_threshold", "slow_call_rate_threshold"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if self.consecutive_failures is not None and self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be at least 1 (or None for off)")
        if self.slow_call_duration is not None and not (
            math.isfinite(self.slow_call_duration) and self.slow_call_duration > 0
        ):
            raise ValueError("slow_call_duration must be a positive number of seconds or None")
        if not (math.isfinite(self.open_time) and self.open_time > 0):
            raise ValueError(
                f"open_time must be a positive number of seconds, got {self.open_time!r}"
            )
        if not (math.isfinite(self.max_open_time) and self.max_open_time >= self.open_time):
            raise ValueError("max_open_time must be a finite number >= open_time")
        if not (math.isfinite(self.jitter) and 0 <= self.jitter <= 1):
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter!r}")
        if self.half_open_calls < 1:
            raise ValueError("half_open_calls must be at least 1")
        if self.half_open_successes is not None and self.half_open_successes < 1:
            raise ValueError("half_open_successes must be at least 1 (or None)")

    @property
    def successes_to_close(self) -> int:
        """Probe successes that close a half-open breaker."""
        if self.half_open_successes is None:
            return self.half_open_calls
        return self.half_open_successes


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """One state change, as the telemetry sees it.

    ``reason`` is one of ``failure_rate``, ``slow_call_rate``, ``consecutive_failures``
    (closed → open), ``open_time_elapsed`` (open → half_open), ``probe_failed``,
    ``probe_slow`` (half_open → open), ``probes_succeeded`` (half_open → closed).
    """

    name: str
    from_state: CircuitState
    to_state: CircuitState
    reason: str
    #: Clock time of the change (``Clock.now()``, monotonic seconds).
    at: float
    #: Seconds the breaker stays open; None unless ``to_state`` is open.
    open_for: float | None = None


BreakerListener = Callable[[BreakerTransition], None]


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """A frozen copy of a breaker at one instant, for ``client.stats()`` and tests."""

    name: str
    state: CircuitState
    #: Outcomes in the window, and how many of them failed or were slow.
    calls: int
    failures: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    consecutive_failures: int
    #: Seconds until an open breaker lets probes through; None when not open.
    retry_in: float | None
    probes_in_flight: int
    #: Times the breaker has opened since it was created.
    trips: int


def is_breaker_failure(error: BaseException | None) -> bool:
    """Whether an attempt's outcome says the server is unwell (None: it succeeded):
    crash-like failures only (refused or timed-out connections, 5xx but 503, 408,
    a stream cut before its first chunk, a broken 2xx body), never a shed, a 429,
    the caller's own error or a refusal made here. The rule and its reasons live
    in ``_verdict.classify`` (``Verdict.breaker_failure``)."""
    return classify(error).breaker_failure


_SUCCESS, _FAILURE, _IGNORE = "success", "failure", "ignore"


class Permit:
    """Leave to make one call through a breaker; settle it exactly once.

    Settling again is a no-op, so a ``finally: permit.ignore()`` after an explicit
    ``success``/``failure`` is safe. ``duration`` defaults to the time since the
    permit was granted.
    """

    __slots__ = ("_breaker", "_epoch", "_probe", "_settled", "_started")

    def __init__(
        self, breaker: CircuitBreaker, epoch: int, started: float, probe: int | None
    ) -> None:
        self._breaker = breaker
        self._epoch = epoch
        self._started = started
        self._probe = probe
        self._settled = False

    @property
    def probe(self) -> bool:
        """True when this call is a half-open probe."""
        return self._probe is not None

    @property
    def settled(self) -> bool:
        return self._settled

    def success(self, duration: float | None = None) -> None:
        """The server served the call (slow when ``duration`` exceeds the threshold)."""
        self._breaker._settle(self, _SUCCESS, duration, None)

    def failure(self, duration: float | None = None, *, retry_after: float | None = None) -> None:
        """The server failed the call; ``retry_after`` (its Retry-After) lengthens an opening."""
        self._breaker._settle(self, _FAILURE, duration, retry_after)

    def ignore(self) -> None:
        """Count nothing (caller error, cancelled, never sent); frees a half-open slot."""
        self._breaker._settle(self, _IGNORE, None, None)

    def settle(
        self,
        error: BaseException | None,
        duration: float | None = None,
        *,
        verdict: Verdict | None = None,
    ) -> None:
        """Settle by the outcome's ``Verdict`` (``verdict``, else classified here):
        None succeeds, a breaker failure fails (with the error's Retry-After),
        anything else is ignored."""
        if error is None:
            self.success(duration)
        elif (verdict or classify(error)).breaker_failure:
            load = getattr(error, "server_load", None)
            self.failure(duration, retry_after=getattr(load, "retry_after", None))
        else:
            self.ignore()


class CircuitBreaker:
    """Closed → open on failures, open → half_open after the open time, then probes decide.

    >>> from stormguard.testing import FakeClock
    >>> clock = FakeClock()
    >>> breaker = CircuitBreaker("m@http://gpu-1", BreakerConfig(jitter=0), clock=clock)
    >>> for _ in range(10): breaker.before_call().failure(retry_after=8.0)
    >>> breaker.state.value, breaker.snapshot().retry_in
    ('open', 8.0)
    >>> clock.advance(8); breaker.before_call().success(); breaker.before_call().success()
    >>> breaker.state.value
    'closed'

    Outcomes of permits granted before the last state change are dropped: a call
    sent while the breaker was closed does not decide a half-open probe.
    """

    def __init__(
        self,
        name: str,
        config: BreakerConfig | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        listeners: Sequence[BreakerListener] = (),
    ) -> None:
        self.name = name
        self.config = config if config is not None else BreakerConfig()
        self._clock = clock or Clock()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._outbox: Outbox[BreakerTransition] = Outbox(
            self._lock, listeners, _describe_breaker_transition, logger
        )
        self._state = CircuitState.CLOSED
        self._epoch = 0  # bumped on every state change; permits remember theirs
        self._window: deque[tuple[bool, bool]] = deque()  # (failed, slow), oldest first
        self._failures = 0
        self._slow = 0
        self._consecutive = 0
        self._streak = 0  # trips since the breaker last closed: the growth exponent
        self._trips = 0
        self._open_until = 0.0
        self._retry_hint_until = -math.inf  # latest "come back at" a server gave
        self._probe_ids = itertools.count()
        self._probes: dict[int, float] = {}  # probe id -> time granted
        self._probe_successes = 0

    # -- public --------------------------------------------------------------------------

    def before_call(self) -> Permit:
        """A permit for one call, or ``CircuitOpenError`` (no I/O) when open or when
        every half-open probe slot is taken."""
        refusal: CircuitOpenError | None = None
        with self._lock:
            now = self._clock.now()
            self._advance(now)
            if self._state is CircuitState.CLOSED:
                permit = Permit(self, self._epoch, now, None)
            elif self._state is CircuitState.OPEN:
                retry_in = self._open_until - now
                refusal = CircuitOpenError(
                    f"Circuit breaker {self.name} is open; probing again in {retry_in:.1f}s",
                    breaker=self.name,
                    retry_in=retry_in,
                )
            else:
                self._reclaim_lost_probes(now)
                if len(self._probes) < self.config.half_open_calls:
                    probe = next(self._probe_ids)
                    self._probes[probe] = now
                    permit = Permit(self, self._epoch, now, probe)
                else:
                    refusal = CircuitOpenError(
                        f"Circuit breaker {self.name} is half-open and its "
                        f"{self.config.half_open_calls} probe(s) are in flight",
                        breaker=self.name,
                    )
        self._emit()
        if refusal is not None:
            raise refusal
        return permit

    @property
    def state(self) -> CircuitState:
        """The current state (an open breaker whose time is up reads, and becomes, half_open)."""
        with self._lock:
            self._advance(self._clock.now())
            state = self._state
        self._emit()
        return state

    @property
    def accepting(self) -> bool:
        """Whether ``before_call`` would grant a permit now (closed, or half-open with a
        free probe slot): what endpoint choice asks before picking this endpoint."""
        with self._lock:
            now = self._clock.now()
            self._advance(now)
            if self._state is CircuitState.HALF_OPEN:
                self._reclaim_lost_probes(now)
                accepting = len(self._probes) < self.config.half_open_calls
            else:
                accepting = self._state is CircuitState.CLOSED
        self._emit()
        return accepting

    def snapshot(self) -> BreakerSnapshot:
        """Counts and state at this instant."""
        with self._lock:
            now = self._clock.now()
            self._advance(now)
            calls = len(self._window)
            snapshot = BreakerSnapshot(
                name=self.name,
                state=self._state,
                calls=calls,
                failures=self._failures,
                slow_calls=self._slow,
                failure_rate=self._failures / calls if calls else 0.0,
                slow_call_rate=self._slow / calls if calls else 0.0,
                consecutive_failures=self._consecutive,
                retry_in=self._open_until - now if self._state is CircuitState.OPEN else None,
                probes_in_flight=len(self._probes),
                trips=self._trips,
            )
        self._emit()
        return snapshot

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self._state.value})"

    # -- under the lock ------------------------------------------------------------------

    def _settle(
        self, permit: Permit, outcome: str, duration: float | None, retry_after: float | None
    ) -> None:
        with self._lock:
            if permit._settled:
                return
            permit._settled = True
            if permit._epoch != self._epoch:
                return
            if permit._probe is not None:
                self._probes.pop(permit._probe, None)
            if outcome != _IGNORE:
                now = self._clock.now()
                elapsed = now - permit._started if duration is None else duration
                limit = self.config.slow_call_duration
                slow = limit is not None and elapsed > limit
                failed = outcome == _FAILURE
                if failed and retry_after is not None and math.isfinite(retry_after):
                    self._retry_hint_until = max(self._retry_hint_until, now + retry_after)
                if self._state is CircuitState.CLOSED:
                    self._record(failed, slow, now)
                elif failed:
                    self._trip(now, "probe_failed")
                elif slow:
                    self._trip(now, "probe_slow")
                else:
                    self._probe_successes += 1
                    if self._probe_successes >= self.config.successes_to_close:
                        self._change(CircuitState.CLOSED, "probes_succeeded", now)
        self._emit()

    def _record(self, failed: bool, slow: bool, now: float) -> None:
        config = self.config
        if len(self._window) == config.window_size:
            old_failed, old_slow = self._window.popleft()
            self._failures -= old_failed
            self._slow -= old_slow
        self._window.append((failed, slow))
        self._failures += failed
        self._slow += slow
        self._consecutive = self._consecutive + 1 if failed else 0
        calls = len(self._window)
        if config.consecutive_failures is not None and (
            self._consecutive >= config.consecutive_failures
        ):
            self._trip(now, "consecutive_failures")
        elif calls >= config.minimum_calls:
            # Divide rather than multiply: 7 / 10 >= 0.7 holds, 7 >= 0.7 * 10 does not.
            if self._failures / calls >= config.failure_rate_threshold:
                self._trip(now, "failure_rate")
            elif config.slow_call_duration is not None and (
                self._slow / calls >= config.slow_call_rate_threshold
            ):
                self._trip(now, "slow_call_rate")

    def _trip(self, now: float, reason: str) -> None:
        config = self.config
        self._streak += 1
        self._trips += 1
        grown = config.open_time * 2.0 ** min(self._streak - 1, 62)
        floor = max(grown, self._retry_hint_until - now)
        open_for = min(floor, config.max_open_time) * self._rng.uniform(1.0, 1.0 + config.jitter)
        self._open_until = now + open_for
        self._change(CircuitState.OPEN, reason, now, open_for)

    def _advance(self, now: float) -> None:
        if self._state is CircuitState.OPEN and now >= self._open_until:
            self._change(CircuitState.HALF_OPEN, "open_time_elapsed", now)

    def _reclaim_lost_probes(self, now: float) -> None:
        # A permit that is never settled (a stream abandoned unclosed) must not hold
        # a probe slot for ever: a probe outstanding for longer than the longest open
        # time is presumed lost, like a server that never answered.
        if len(self._probes) >= self.config.half_open_calls:
            cutoff = now - self.config.max_open_time
            for probe, granted in list(self._probes.items()):
                if granted <= cutoff:
                    del self._probes[probe]

    def _change(
        self, to: CircuitState, reason: str, now: float, open_for: float | None = None
    ) -> None:
        before, self._state = self._state, to
        self._epoch += 1
        self._probes.clear()
        self._probe_successes = 0
        if to is CircuitState.CLOSED:
            self._window.clear()
            self._failures = self._slow = self._consecutive = 0
            self._streak = 0
        if self._outbox.listening:
            self._outbox.put(BreakerTransition(self.name, before, to, reason, now, open_for))

    def _emit(self) -> None:
        """Hand pending transitions to the listeners (``_outbox.py``), without the lock."""
        self._outbox.deliver()


def _describe_breaker_transition(transition: BreakerTransition) -> str:
    return f"breaker {transition.name}: {transition.from_state.value} → {transition.to_state.value}"


class BreakerRegistry:
    """One breaker per (endpoint, model), made on first use from one config.

    Bounded: past ``max_breakers`` keys the least recently used breaker is
    forgotten, so a client that calls many models cannot grow without end (a
    forgotten breaker starts closed when its key comes back).

    >>> registry = BreakerRegistry()
    >>> registry.get("http://gpu-1/v1", "llama") is registry.get("http://gpu-1/v1", "llama")
    True
    """

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        max_breakers: int = 1024,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        listeners: Sequence[BreakerListener] = (),
    ) -> None:
        if max_breakers < 1:
            raise ValueError("max_breakers must be at least 1")
        self.config = config if config is not None else BreakerConfig()
        self.max_breakers = max_breakers
        self._clock = clock or Clock()
        self._rng = rng or random.Random()
        self._listeners = tuple(listeners)
        self._breakers: OrderedDict[tuple[str, str | None], CircuitBreaker] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def breaker_name(endpoint: str, model: str | None) -> str:
        """``model@endpoint``, or the endpoint alone for calls without a model."""
        return endpoint if model is None else f"{model}@{endpoint}"

    def get(self, endpoint: str, model: str | None = None) -> CircuitBreaker:
        """The breaker of ``(endpoint, model)``, created closed if new."""
        key = (endpoint, model)
        with self._lock:
            breaker = self._breakers.get(key)
            if breaker is not None:
                self._breakers.move_to_end(key)
                return breaker
            breaker = CircuitBreaker(
                self.breaker_name(endpoint, model),
                self.config,
                clock=self._clock,
                rng=self._rng,
                listeners=self._listeners,
            )
            self._breakers[key] = breaker
            if len(self._breakers) > self.max_breakers:
                self._breakers.popitem(last=False)
            return breaker

    def snapshot(self) -> dict[tuple[str, str | None], BreakerSnapshot]:
        """Every breaker's state, keyed by (endpoint, model)."""
        with self._lock:
            items = list(self._breakers.items())
        return {key: breaker.snapshot() for key, breaker in items}

    def __len__(self) -> int:
        with self._lock:
            return len(self._breakers)
