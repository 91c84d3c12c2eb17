"""The circuit breaker of one (endpoint, model): closed, open, half-open, and the
permits that let single calls through.

The states and their names are resilience4j's (closed, open, half_open); when
it trips and for how long is ``BreakerConfig`` (``_policies/breaker/config.py``).

The caller decides what an outcome is: the client reads it from the outcome's
``Verdict`` (``verdict.classify``: connection errors, timeouts, 5xx but 503,
408; never a shed or a 429), and ``Permit`` records one call's outcome. Every
method is thread-safe and usable from asyncio: one ``threading.Lock``, never
held across I/O, a sleep or a listener.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections import deque
from collections.abc import Sequence

from ..._core.clock import Clock
from ..._core.exceptions import CircuitOpenError
from ..._core.fork import fork_safe_lock
from ..._core.outbox import Outbox
from ..._core.verdict import Verdict, classify
from .config import BreakerConfig
from .states import BreakerListener, BreakerSnapshot, BreakerTransition, CircuitState

__all__ = ["CircuitBreaker", "Permit"]

#: The breaker's documented logger (docs/breakers.md): named for the module the
#: breaker was first written in, the name users filter on.
logger = logging.getLogger("stormguard._breaker")


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
        self._lock = fork_safe_lock()
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
        """Hand pending transitions to the listeners (``_core/outbox.py``), without the lock."""
        self._outbox.deliver()


def _describe_breaker_transition(transition: BreakerTransition) -> str:
    return f"breaker {transition.name}: {transition.from_state.value} → {transition.to_state.value}"
