"""How an endpoint's concurrency limit moves: AIMD on explicit drops.

The limit is learned with **AIMD on explicit drops** (Netflix
concurrency-limits' ``AIMDLimit``; TCP Reno's slow start and congestion
avoidance): a shed before processing is the only signal that lowers it, since
LLM call durations follow output length, not congestion (a latency-gradient
limiter such as Vegas or Gradient2 reads a long generation as queueing).

* **Slow start** (``initial_limit`` 20, Netflix's default): each success adds 1
  while the limit is in use (in flight at send · 2 ≥ limit), so the limit
  doubles per round trip until the first drop, or until the server reports a
  queue of its own (the counterpart of TCP's HyStart, below).
* **Congestion avoidance** after that: + 1/limit per success, one slot per
  round trip, so a limit just below the server's capacity stays there for
  many calls instead of probing it every few (Netflix's +1 per sample sheds
  about one call in four at a steady capacity).
* **Drop**: limit * ``backoff_ratio`` (0.9, Netflix's), at most once per
  round trip: a drop of an attempt sent before the last decrease was caused
  by the old limit and is not counted again. Drops in a row, with no success
  between them, bring the limit down to what is still in flight (TCP's "pipe"
  in loss recovery): the server holds no more than that. A stream the server
  cuts mid-way is a drop too (a crash cuts them all). At the floor
  (``min_limit``) a shed pauses the endpoint instead: for the server's
  Retry-After, else for a backoff that doubles from 0.25 s to 8 s while the
  sheds go on (a server behind a plain 503 would otherwise see one probe per
  waiting call). A cut stream never pauses it: it is no refusal. So a crash,
  or a server that refuses everything, costs one window of attempts and a few
  probes, not a window per 10 % step down.
* **A server queue** (``x-queue-depth`` > 0 on a success): no growth, and slow
  start ends: the server's batch is full, more calls here would only wait there.
* **Restart** (``engine_restart``/``warming``/``draining`` sheds): the engine
  is not serving, and its Retry-After says for how long. The endpoint is
  **paused** that long: no slot is granted, the queue holds (a call whose
  deadline comes first fails at once), and the limit falls to ``min_limit``.
  When the pause ends, one probe goes; while the server answers, the limit
  slow-starts again up to half the limit it had: the recovery ramp of
  warm-up traffic raised step by step, even from a server that does no slow
  start of its own.
* **Hot KV cache** (``x-kv-cache-usage`` ≥ 0.9, or ORCA's): no growth, so a
  server near preemption is not pushed over.
* **Where it went down**: past 0.9 x the limit at which the server last went
  down (a restart, an opened breaker), growth is 8 times slower (CUBIC's
  plateau near its last loss): a server that gives no load signal at all (a
  bare engine that crashes when its KV cache overflows) is not walked back into
  the same crash by the backlog.
* **Slow first token** (a stream's time to first token over twice the fastest
  of the last 64, plus 50 ms): no growth, and slow start ends. Time to first
  token is queueing plus prefill, not output length, so unlike the whole
  call's latency it does rise when the server starts to queue; it only holds
  the limit, never lowers it (a long prompt's prefill is slow too).


Only the arithmetic of the limit and its pauses: no lock (the endpoint's, in
``_policies/limiter/endpoint_limit.py``, is held around every call here), no queue, and no
reading of the clock (the caller passes ``now``). The limiter's options are read
through ``LimitSettings``, which ``ConcurrencyLimiter`` (``_policies/limiter/limiter.py``) meets.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Protocol

from ...protocol import ServerLoad

if TYPE_CHECKING:
    import random

    from .lease import Lease

__all__ = ["AimdLimit", "LimitSettings"]

#: KV-cache usage at or above which the limit does not grow.
HOT_KV_CACHE = 0.9
#: A first token slower than this times the fastest recent one (plus the slack)
#: holds the limit.
SLOW_TTFT_FACTOR = 2.0
SLOW_TTFT_SLACK_S = 0.05
_TTFT_SAMPLES = 64
#: Growth slows this many times once the limit is past this share of the limit at
#: which the server last went down.
CRASH_PLATEAU = 0.9
PLATEAU_SLOWDOWN = 8.0
#: Samples needed before the fastest recent first token is a baseline.
_MIN_TTFT_SAMPLES = 8
#: A restart shed without a Retry-After pauses the endpoint this long.
DEFAULT_RESTART_PAUSE_S = 1.0
#: The first pause after a shed at the floor without a Retry-After (it doubles).
FLOOR_BACKOFF_S = 0.25
#: No pause of an endpoint is longer, whatever the server said (a restart's or a
#: shed's Retry-After, a spent quota's reset): a server's word is advice, not a
#: sentence. The same 60 s as ``RetryPolicy.max_retry_after`` (openai-python's).
MAX_PAUSE_S = 60.0
#: The former name of ``MAX_PAUSE_S``.
MAX_RESTART_PAUSE_S = MAX_PAUSE_S


class LimitSettings(Protocol):
    """The options a limit moves within, read when used (``ConcurrencyLimiter``'s)."""

    initial_limit: int
    min_limit: int
    max_limit: int
    backoff_ratio: float
    #: Jitters the pause after a shed at the floor.
    rng: random.Random


class AimdLimit:
    """The adaptive limit of one endpoint, moved by the outcome of each slot given
    back; the endpoint holds its lock around every call."""

    def __init__(self, owner: LimitSettings) -> None:
        self._owner = owner
        #: The limit, fractional: congestion avoidance adds 1/limit per success.
        self.value = float(owner.initial_limit)
        self.ssthresh = math.inf  # slow start until the first drop
        #: Bumped on every decrease; a lease remembers the epoch it was granted in.
        self.epoch = 0
        #: Decreases of the limit (drops and restarts counted once per round trip).
        self.decreases = 0
        self._ttfts: deque[float] = deque(maxlen=_TTFT_SAMPLES)
        self.paused_until = -math.inf
        #: The pause after the last shed at the floor (doubles while they go on).
        self._floor_backoff = 0.0
        #: Drops since the last success.
        self._drops_in_a_row = 0
        #: The limit when the last success came: what a collapse is recovered towards.
        self._last_good = float(owner.initial_limit)
        #: The limit when the server last went down (restart, breaker opened).
        self._crashed_at = math.inf
        #: What the limit slow-starts back up to after the server went down; until it
        #: gets there (or a drop says the server is full sooner), the endpoint is
        #: ramping back, and a client with another tier sends it only what the ramp
        #: allows (``recovering``).
        self._ramp_to = 0.0

    @property
    def limit(self) -> int:
        return max(int(self.value), 1)

    @property
    def slow_start(self) -> bool:
        return self.value < self.ssthresh

    @property
    def recovering(self) -> bool:
        """Ramping back up after the server went down (``fall_to_floor``)."""
        return self.value < self._ramp_to

    def pause_left(self, now: float) -> float:
        return max(self.paused_until - now, 0.0)

    def pause(self, now: float, seconds: float) -> None:
        """No slot from ``now`` for ``seconds``, at most ``MAX_PAUSE_S``: every pause
        of an endpoint (a restart, a shed at the floor, a spent quota) goes through
        here, so none is longer, whatever the server said."""
        if seconds > 0:  # NaN is not
            self.paused_until = max(self.paused_until, now + min(seconds, MAX_PAUSE_S))

    def succeeded(self, lease: Lease) -> None:
        """A served attempt: the sheds in a row are over, and the limit may grow."""
        self._floor_backoff = 0.0
        self._drops_in_a_row = 0
        self._grow(lease)

    def _grow(self, lease: Lease) -> None:
        owner = self._owner
        slow = lease.ttft is not None and self._slow_first_token(lease.ttft)
        self._last_good = max(self.value, float(self._owner.min_limit))
        if lease.in_flight_at_start * 2 < self.value:
            return  # the limit was not in use: a success says nothing about a higher one
        load = lease.load
        if load is not None:
            if load.kv_cache_usage is not None and load.kv_cache_usage >= HOT_KV_CACHE:
                return
            if load.queue_depth:
                # The server queues: its batch is full, and more calls in flight here
                # would only wait there (where the deadline cannot see them).
                self.ssthresh = min(self.ssthresh, self.value)
                return
        if slow:
            self.ssthresh = min(self.ssthresh, self.value)
            return
        if self.value < self.ssthresh:
            self.value += 1.0
        elif self.value >= CRASH_PLATEAU * self._crashed_at:
            # Near the limit at which the server last went down: creep (CUBIC's
            # plateau near its last loss), so the backlog does not crash it again.
            self.value += 1.0 / (PLATEAU_SLOWDOWN * self.value)
        else:
            self.value += 1.0 / self.value
        self.value = min(self.value, float(owner.max_limit))

    def _slow_first_token(self, ttft: float) -> bool:
        samples = self._ttfts
        fastest = min(samples) if len(samples) >= _MIN_TTFT_SAMPLES else None
        samples.append(ttft)
        return fastest is not None and ttft > SLOW_TTFT_FACTOR * fastest + SLOW_TTFT_SLACK_S

    def dropped(self, lease: Lease, now: float, in_flight: int, *, refused: bool = True) -> None:
        """A shed (``refused``), or a stream the server cut after it began. Amid
        successes, the limit was a little too high: cut it once per round trip.
        Drops in a row, with no success between them, say more: the server holds no
        more than what is still in flight (the "pipe" of TCP's loss recovery, RFC
        6675), so the limit comes down to that at once rather than by 10 % per round
        trip of refused attempts. A run that empties the window (every stream cut by
        a crash, every call refused by a server down behind a plain 503) reaches the
        floor; a shed there pauses the endpoint, a cut does not (the server took
        that call: whether it takes the next, only the next can tell, and one odd
        stream end must not stop an endpoint for seconds). ``in_flight``: the
        attempts still in flight, this one given back."""
        in_a_row = self._drops_in_a_row
        self._drops_in_a_row += 1
        floor = float(self._owner.min_limit)
        if self.value <= floor:
            if refused:
                self._shed_at_floor(now, lease)
        elif not in_a_row:
            self._decrease(lease, self.value * self._owner.backoff_ratio)
        elif in_flight < self.value:
            self.value = max(float(in_flight), floor)
            self.ssthresh = self.value
            self.epoch += 1
            if not in_flight and refused:
                self._shed_at_floor(now, lease)

    def _decrease(self, lease: Lease, to: float) -> bool:
        if lease.epoch != self.epoch:
            return False  # sent under a limit already decreased: one decrease per round trip
        self.value = max(float(self._owner.min_limit), min(self.value, to))
        self.ssthresh = self.value
        self._ramp_to = 0.0  # full sooner than the ramp's top: the server says where it is
        self.epoch += 1
        self.decreases += 1
        return True

    def restarted(self, now: float, load: ServerLoad | None) -> None:
        """The engine is not serving: pause for its Retry-After, then start again from
        the bottom, slow-starting up to half the limit it had (every restart shed
        applies: there is no old limit to blame, the server lost its state)."""
        pause = load.retry_after if load is not None else None
        self.pause(now, DEFAULT_RESTART_PAUSE_S if pause is None else pause)
        self.fall_to_floor()

    def fall_to_floor(self) -> None:
        """The server went down (a restart, an opened breaker): the limit drops to the
        floor and will slow-start back up to half of what it was."""
        self._ttfts.clear()  # a restarted server's first tokens are judged on their own
        floor = float(self._owner.min_limit)
        if self.value <= floor:
            return
        # Where it went down: the limit of the last success, not what a run of sheds
        # (the streams the crash cut) had already brought it down to.
        peak = max(self.value, self._last_good)
        self._crashed_at = peak
        self.ssthresh = self._ramp_to = max(peak / 2.0, floor + 1.0)
        self.value = floor
        self.epoch += 1
        self.decreases += 1

    def _shed_at_floor(self, now: float, lease: Lease) -> None:
        """A shed with the limit at its floor: the server refuses even one call (it is
        full of others' work, or down behind a plain 503). Lowering is no longer an
        answer; waiting is: the endpoint pauses for the server's Retry-After, else
        for a backoff that doubles while the sheds go on (0.25 s to 8 s, jittered),
        so the queue is not emptied one refused probe at a time. When calls get in
        again, the limit slow-starts towards half of what it was before the sheds.
        The rest of a run that brought the limit here changes nothing: only an
        attempt sent at the floor (a probe) doubles the backoff."""
        if lease.epoch != self.epoch and self.pause_left(now) > 0:
            return
        self.epoch += 1
        load = lease.load
        retry_after = load.retry_after if load is not None else None
        if retry_after is not None:
            pause = retry_after
        else:
            self._floor_backoff = min(max(self._floor_backoff * 2, FLOOR_BACKOFF_S), 8.0)
            pause = self._floor_backoff * (0.5 + self._owner.rng.random() / 2)
        self.pause(now, pause)
        self.ssthresh = max(self.ssthresh, self._last_good / 2.0, self._owner.min_limit + 1.0)
        # Refusing even one call is going down, as a restart is: remember where.
        self._crashed_at = self._last_good
