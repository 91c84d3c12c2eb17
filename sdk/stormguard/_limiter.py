"""Adaptive concurrency per endpoint: the calls a server cannot hold wait here.

A server that sheds says "alive, but full". Sending the excess anyway wastes a
request per refusal and fails callers that had time to wait; failing them
locally protects the server by failing the caller. A concurrency limit per
endpoint does neither: calls over it wait in a local queue, within their
deadline, and go out as slots free up.

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
  (``min_limit``) a drop pauses the endpoint instead: for the server's
  Retry-After, else for a backoff that doubles from 0.25 s to 8 s while the
  sheds go on (a server behind a plain 503 would otherwise see one probe per
  waiting call). So a crash, or a server that refuses everything, costs one
  window of attempts and a few probes, not a window per 10 % step down.
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

The queue: ordered by priority (critical, standard, sheddable), then arrival;
bounded (``max_waiting``); exactly one waiter woken per freed slot, more when
the limit rises. A waiter whose deadline cannot be met by the measured rate at
which slots free up is failed at once, and told so; nobody waits to the
deadline to fail (the pitfalls of Netflix's ``BlockingLimiter``, which waits
up to an hour, wakes every waiter at once and keeps no order).

Hand-written: no library does concurrency limiting that is shared by threads
and asyncio tasks, ordered by priority and bounded by each caller's deadline.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._budget import RetryBudget
from ._clock import Clock
from ._exceptions import LocalQueueFullError, QueueTimeoutError
from ._verdict import LimitOutcome, classify
from .protocol import ServerLoad

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "ConcurrencyLimiter",
    "EndpointLimit",
    "Lease",
    "LimitOutcome",
    "LimitSnapshot",
    "SlotWaiter",
    "is_shed",
    "limit_outcome",
    "stream_cut_outcome",
]

DEFAULT_INITIAL_LIMIT = 20
DEFAULT_MIN_LIMIT = 1
DEFAULT_MAX_LIMIT = 1000
DEFAULT_BACKOFF_RATIO = 0.9
DEFAULT_MAX_WAITING = 4096
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
#: How far back the rate at which slots free up is measured.
_RATE_WINDOW_S = 10.0
_RATE_SAMPLES = 512
#: Releases needed before the rate is trusted to fail a waiter early.
_MIN_RATE_SAMPLES = 4
_HOLD_SAMPLES = 64
#: The hopeless-waiter sweep runs at most this often.
_SWEEP_EVERY_S = 0.1
#: A restart shed without a Retry-After pauses the endpoint this long.
DEFAULT_RESTART_PAUSE_S = 1.0
#: The first pause after a shed at the floor without a Retry-After (it doubles).
FLOOR_BACKOFF_S = 0.25
#: No pause is longer (a server's Retry-After is advice, not a sentence).
MAX_RESTART_PAUSE_S = 60.0


def is_shed(error: BaseException | None) -> bool:
    """Whether an attempt was refused before the server worked on it: a 503 (the
    reference server's ``x-load-shed``, vLLM's queue-full answer, as a JSON body or
    as an error event inside a 200 stream before any content) or a 429 (the
    caller's rate, or the server's load). ``too_long`` is the caller's error, and
    a 429 out of quota (``insufficient_quota``) the caller's account's.
    ``Verdict.shed`` (``_verdict.classify``)."""
    return classify(error).shed


def limit_outcome(error: BaseException | None) -> LimitOutcome:
    """What an attempt's outcome (None: it succeeded) tells the concurrency limit:
    a shed is a drop (a restart shed, a pause), anything else served or says
    nothing about load. ``Verdict.limit`` (``_verdict.classify``)."""
    return classify(error).limit


def stream_cut_outcome(error: BaseException) -> LimitOutcome:
    """What a stream that failed after its first chunk tells the limit: a cut by the
    server (the connection, a 5xx event) is a drop, anything else (the caller's
    deadline, a malformed chunk) says nothing. ``Verdict.limit_after_first_chunk``."""
    return classify(error).limit_after_first_chunk


@dataclass(frozen=True, slots=True)
class LimitSnapshot:
    """A frozen copy of one endpoint's limit, taken by ``state()``."""

    endpoint: str
    limit: int
    in_flight: int
    waiting: int
    slow_start: bool
    #: Decreases of the limit (drops and restarts counted once per round trip).
    decreases: int
    #: Waiters failed because their deadline could not be met, or the queue was full.
    refused: int
    #: Seconds the endpoint stays paused (a restart shed's Retry-After); 0: not paused.
    paused_for: float = 0.0


class Lease:
    """One slot of an endpoint's limit, held by one attempt; released exactly once."""

    __slots__ = (
        "_limit",
        "epoch",
        "granted_at",
        "in_flight_at_start",
        "load",
        "outcome",
        "queued_s",
        "released",
        "ttft",
    )

    def __init__(
        self, limit: EndpointLimit, epoch: int, in_flight: int, queued_s: float, granted_at: float
    ) -> None:
        self._limit = limit
        self.epoch = epoch
        self.granted_at = granted_at
        self.in_flight_at_start = in_flight
        #: Seconds the call waited in the local queue for this slot.
        self.queued_s = queued_s
        self.outcome = LimitOutcome.IGNORED
        self.load: ServerLoad | None = None
        #: A stream's time to first token (None for other calls).
        self.ttft: float | None = None
        self.released = False

    @property
    def endpoint(self) -> str:
        return self._limit.name

    @property
    def limit(self) -> int:
        """The endpoint's limit when this slot was granted."""
        return self._limit.limit

    def mark(
        self, outcome: LimitOutcome, load: ServerLoad | None = None, ttft: float | None = None
    ) -> None:
        """Record how the attempt went; the slot is freed later (a stream holds it to its end)."""
        self.outcome = outcome
        self.load = load
        self.ttft = ttft

    def release(self) -> None:
        """Free the slot with the outcome marked (IGNORED when none was)."""
        if not self.released:
            self.released = True
            self._limit.release(self)

    def __repr__(self) -> str:
        return f"Lease({self.endpoint!r}, outcome={self.outcome.value})"


class SlotWaiter:
    """A call waiting for a slot. The driver waits with ``wait`` (a thread) or
    ``wait_async`` (a task); both return the granted ``Lease`` or raise
    ``QueueTimeoutError``. One waiter is woken per freed slot."""

    __slots__ = (
        "_error",
        "_lease",
        "_limit",
        "_wake",
        "deadline_at",
        "enqueued_at",
        "key",
    )

    def __init__(self, limit: EndpointLimit, key: tuple[int, int], deadline_at: float) -> None:
        self._limit = limit
        self.key = key
        self.deadline_at = deadline_at
        self.enqueued_at = limit.clock.now()
        self._lease: Lease | None = None
        self._error: QueueTimeoutError | None = None
        self._wake: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        return self._lease is not None or self._error is not None

    def _resolve(self, lease: Lease | None, error: QueueTimeoutError | None) -> Callable[[], None]:
        """Under the limit's lock: settle the waiter; returns its wake-up, to call unlocked."""
        self._lease, self._error = lease, error
        return self._wake or _nothing

    def _outcome(self) -> Lease:
        if self._lease is not None:
            return self._lease
        assert self._error is not None
        raise self._error

    def wait(self, timeout: float | None) -> Lease:
        """Block the thread until granted, refused, or ``timeout`` (the call's deadline)."""
        event = threading.Event()
        end = _End(timeout)
        limit = self._limit
        try:
            if not limit._on_wake(self, event.set):
                while True:
                    pause = limit._pause_for(self)
                    if pause > 0:
                        # Nothing is granted during a pause: sleep through it on the
                        # limiter's clock (a test's fake clock moves), then look again.
                        limit.clock.sleep(pause)
                    else:
                        event.wait(end.left())
                        event.clear()  # woken without a slot: a pause began
                    if self._settled_or_over(end):
                        break
        except BaseException:  # KeyboardInterrupt in the wait
            limit._abandon(self)
            raise
        return limit._finish_wait(self)

    async def wait_async(self, timeout: float | None) -> Lease:
        """Suspend the task until granted, refused, or ``timeout``; a cancelled task
        leaves the queue (and gives back a slot granted meanwhile)."""
        import asyncio  # here, not at module level: sync users never load asyncio

        loop = asyncio.get_running_loop()
        current: list[asyncio.Future[None]] = [loop.create_future()]
        end = _End(timeout)
        limit = self._limit

        def wake() -> None:  # any thread
            loop.call_soon_threadsafe(lambda: _set_result(current[0]))

        try:
            if not limit._on_wake(self, wake):
                while True:
                    pause = limit._pause_for(self)
                    if pause > 0:
                        await limit.clock.asleep(pause)
                    else:
                        # asyncio.TimeoutError is TimeoutError only from Python 3.11.
                        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                            await asyncio.wait_for(asyncio.shield(current[0]), end.left())
                        current[0] = loop.create_future()
                    if self._settled_or_over(end):
                        break
        except BaseException:
            limit._abandon(self)
            raise
        return limit._finish_wait(self)

    def _settled_or_over(self, end: _End) -> bool:
        """After a wake-up: granted or refused, out of time, or granted just now (a
        pause that ended with nobody to notice)."""
        limit = self._limit
        return (
            self.done or end.over() or limit.clock.now() >= self.deadline_at or limit._resume(self)
        )


class _End:
    """When a wait gives up, on the monotonic clock (None: never)."""

    __slots__ = ("_at",)

    def __init__(self, timeout: float | None) -> None:
        self._at = None if timeout is None else time.monotonic() + max(timeout, 0.0)

    def left(self) -> float | None:
        return None if self._at is None else max(self._at - time.monotonic(), 0.0)

    def over(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0


def _nothing() -> None:
    return None


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class EndpointLimit:
    """The adaptive limit and local queue of one endpoint (thread-safe)."""

    def __init__(self, name: str, owner: ConcurrencyLimiter) -> None:
        self.name = name
        self.clock = owner.clock
        self._owner = owner
        self._lock = threading.Lock()
        self._limit = float(owner.initial_limit)
        self._ssthresh = math.inf  # slow start until the first drop
        self._epoch = 0
        self._in_flight = 0
        self._queue: list[tuple[tuple[int, int], SlotWaiter]] = []
        self._waiting = 0
        self._decreases = 0
        self._refused = 0
        self._releases: deque[float] = deque(maxlen=_RATE_SAMPLES)
        #: How long recent successes held their slot (Little's law: limit / hold = rate).
        self._holds: deque[float] = deque(maxlen=_HOLD_SAMPLES)
        self._granted_sum = 0.0  # of the grant times of the attempts in flight
        self._ttfts: deque[float] = deque(maxlen=_TTFT_SAMPLES)
        self._last_sweep = -math.inf
        self._paused_until = -math.inf
        #: The pause after the last shed at the floor (doubles while they go on).
        self._floor_backoff = 0.0
        #: Drops since the last success.
        self._drops_in_a_row = 0
        #: The limit when the last success came: what a collapse is recovered towards.
        self._last_good = float(owner.initial_limit)
        #: The limit when the server last went down (restart, breaker opened).
        self._crashed_at = math.inf

    @property
    def limit(self) -> int:
        return max(int(self._limit), 1)

    def full_without(self, held: int = 1) -> bool:
        """Whether a call that gives back the ``held`` slots it has would still have to
        wait for one: the endpoint is paused, other calls fill the limit, or wait already."""
        with self._lock:
            return (
                self._pause_left(self.clock.now()) > 0
                or self._in_flight - held >= self.limit
                or self._waiting > 0
            )

    def went_down(self) -> None:
        """The endpoint stopped serving (its breaker opened): when calls return to it,
        the limit starts from the bottom and slow-starts back up to half of what it
        was, as after a restart, so a recovering server is not handed its old load
        at once."""
        with self._lock:
            self._fall_to_floor()

    def has_room(self) -> bool:
        with self._lock:
            return (
                self._in_flight < self.limit
                and self._waiting == 0
                and self._pause_left(self.clock.now()) == 0
            )

    def expected_wait(self) -> float:
        """Waiters per slot plus any pause: a rough cost of queueing here, for choosing
        an endpoint."""
        with self._lock:
            queued = (self._waiting + max(self._in_flight - self.limit + 1, 0)) / self.limit
            return queued + self._pause_left(self.clock.now())

    def acquire(self, rank: int, seq: int, deadline_at: float) -> Lease | SlotWaiter:
        """A slot now, or a waiter to wait on; raises ``LocalQueueFullError`` when the
        queue is full and ``QueueTimeoutError`` when the deadline cannot be met."""
        wakes: list[Callable[[], None]] = []
        with self._lock:
            now = self.clock.now()
            if self._in_flight < self.limit and not self._waiting and not self._pause_left(now):
                return self._grant(0.0)
            if self._waiting >= self._owner.max_waiting:
                self._refused += 1
                raise LocalQueueFullError(
                    f"{self._waiting} calls already wait for a slot of {self.name}"
                    f" (max_waiting={self._owner.max_waiting})",
                    endpoint=self.name,
                    waiting=self._waiting,
                )
            waiter = SlotWaiter(self, (rank, seq), deadline_at)
            estimate = self._wait_estimate(self._waiting)  # as if last in line: cheap
            if estimate is not None and now + estimate > deadline_at:
                ahead = sum(1 for key, w in self._queue if key < waiter.key and not w.done)
                estimate = self._wait_estimate(ahead)
                if estimate is not None and now + estimate > deadline_at:
                    self._refused += 1
                    raise self._deadline_error(waiter, now, estimate)
            heapq.heappush(self._queue, (waiter.key, waiter))
            self._waiting += 1
            wakes = self._grant_waiters()
        _call_all(wakes)
        return waiter

    def release(self, lease: Lease) -> None:
        """An attempt gave its slot back: adapt the limit, wake whoever may go now."""
        with self._lock:
            self._in_flight -= 1
            self._granted_sum = self._granted_sum - lease.granted_at if self._in_flight else 0.0
            now = self.clock.now()
            outcome = lease.outcome
            paused_until = self._paused_until
            self._releases.append(now)  # every release frees a slot: the queue's pace
            if outcome is LimitOutcome.SUCCESS:
                self._holds.append(now - lease.granted_at)
                self._floor_backoff = 0.0
                self._drops_in_a_row = 0
                self._grow(lease)
            elif outcome is LimitOutcome.DROPPED:
                self._dropped(lease, now)
            elif outcome is LimitOutcome.RESTARTING:
                self._restart(now, lease.load)
            wakes = self._grant_waiters()
            paused = self._paused_until > paused_until
            # A pause that begins is news to every waiter: who cannot outlast it fails
            # now, the others sleep through it.
            wakes += self._sweep(now, force=paused)
            if paused:
                wakes += [w._wake for _, w in self._queue if not w.done and w._wake]
        _call_all(wakes)

    def state(self) -> LimitSnapshot:
        with self._lock:
            return LimitSnapshot(
                endpoint=self.name,
                limit=self.limit,
                in_flight=self._in_flight,
                waiting=self._waiting,
                slow_start=self._limit < self._ssthresh,
                decreases=self._decreases,
                refused=self._refused,
                paused_for=self._pause_left(self.clock.now()),
            )

    # -- internals, all under the lock ------------------------------------------------

    def _grant(self, queued_s: float) -> Lease:
        self._in_flight += 1
        now = self.clock.now()
        self._granted_sum += now
        return Lease(self, self._epoch, self._in_flight, queued_s, now)

    def _grow(self, lease: Lease) -> None:
        owner = self._owner
        slow = lease.ttft is not None and self._slow_first_token(lease.ttft)
        self._last_good = max(self._limit, float(self._owner.min_limit))
        if lease.in_flight_at_start * 2 < self._limit:
            return  # the limit was not in use: a success says nothing about a higher one
        load = lease.load
        if load is not None:
            if load.kv_cache_usage is not None and load.kv_cache_usage >= HOT_KV_CACHE:
                return
            if load.queue_depth:
                # The server queues: its batch is full, and more calls in flight here
                # would only wait there (where the deadline cannot see them).
                self._ssthresh = min(self._ssthresh, self._limit)
                return
        if slow:
            self._ssthresh = min(self._ssthresh, self._limit)
            return
        if self._limit < self._ssthresh:
            self._limit += 1.0
        elif self._limit >= CRASH_PLATEAU * self._crashed_at:
            # Near the limit at which the server last went down: creep (CUBIC's
            # plateau near its last loss), so the backlog does not crash it again.
            self._limit += 1.0 / (PLATEAU_SLOWDOWN * self._limit)
        else:
            self._limit += 1.0 / self._limit
        self._limit = min(self._limit, float(owner.max_limit))

    def _slow_first_token(self, ttft: float) -> bool:
        samples = self._ttfts
        fastest = min(samples) if len(samples) >= _MIN_TTFT_SAMPLES else None
        samples.append(ttft)
        return fastest is not None and ttft > SLOW_TTFT_FACTOR * fastest + SLOW_TTFT_SLACK_S

    def _dropped(self, lease: Lease, now: float) -> None:
        """A shed. Amid successes, the limit was a little too high: cut it once per
        round trip. Drops in a row, with no success between them, say more: the
        server holds no more than what is still in flight (the "pipe" of TCP's
        loss recovery, RFC 6675), so the limit comes down to that at once rather
        than by 10 % per round trip of refused attempts. A run that empties the
        window (every stream cut by a crash, every call refused by a server down
        behind a plain 503) reaches the floor, and the floor's pause."""
        in_a_row = self._drops_in_a_row
        self._drops_in_a_row += 1
        floor = float(self._owner.min_limit)
        if self._limit <= floor:
            self._shed_at_floor(now, lease)
        elif not in_a_row:
            self._decrease(lease, self._limit * self._owner.backoff_ratio)
        elif self._in_flight < self._limit:
            self._limit = max(float(self._in_flight), floor)
            self._ssthresh = self._limit
            self._epoch += 1
            if not self._in_flight:
                self._shed_at_floor(now, lease)

    def _decrease(self, lease: Lease, to: float) -> bool:
        if lease.epoch != self._epoch:
            return False  # sent under a limit already decreased: one decrease per round trip
        self._limit = max(float(self._owner.min_limit), min(self._limit, to))
        self._ssthresh = self._limit
        self._epoch += 1
        self._decreases += 1
        return True

    def _restart(self, now: float, load: ServerLoad | None) -> None:
        """The engine is not serving: pause for its Retry-After, then start again from
        the bottom, slow-starting up to half the limit it had (every restart shed
        applies: there is no old limit to blame, the server lost its state)."""
        pause = load.retry_after if load is not None else None
        pause = DEFAULT_RESTART_PAUSE_S if pause is None else min(pause, MAX_RESTART_PAUSE_S)
        self._paused_until = max(self._paused_until, now + pause)
        self._fall_to_floor()

    def _fall_to_floor(self) -> None:
        self._ttfts.clear()  # a restarted server's first tokens are judged on their own
        floor = float(self._owner.min_limit)
        if self._limit <= floor:
            return
        # Where it went down: the limit of the last success, not what a run of sheds
        # (the streams the crash cut) had already brought it down to.
        peak = max(self._limit, self._last_good)
        self._crashed_at = peak
        self._ssthresh = max(peak / 2.0, floor + 1.0)
        self._limit = floor
        self._epoch += 1
        self._decreases += 1

    def _shed_at_floor(self, now: float, lease: Lease) -> None:
        """A shed with the limit at its floor: the server refuses even one call (it is
        full of others' work, or down behind a plain 503). Lowering is no longer an
        answer; waiting is: the endpoint pauses for the server's Retry-After, else
        for a backoff that doubles while the sheds go on (0.25 s to 8 s, jittered),
        so the queue is not emptied one refused probe at a time. When calls get in
        again, the limit slow-starts towards half of what it was before the sheds.
        The rest of a run that brought the limit here changes nothing: only an
        attempt sent at the floor (a probe) doubles the backoff."""
        if lease.epoch != self._epoch and self._pause_left(now) > 0:
            return
        self._epoch += 1
        load = lease.load
        retry_after = load.retry_after if load is not None else None
        if retry_after is not None:
            pause = min(retry_after, MAX_RESTART_PAUSE_S)
        else:
            self._floor_backoff = min(max(self._floor_backoff * 2, FLOOR_BACKOFF_S), 8.0)
            pause = self._floor_backoff * (0.5 + self._owner.rng.random() / 2)
        self._paused_until = max(self._paused_until, now + pause)
        self._ssthresh = max(self._ssthresh, self._last_good / 2.0, self._owner.min_limit + 1.0)
        # Refusing even one call is going down, as a restart is: remember where.
        self._crashed_at = self._last_good

    def _pause_left(self, now: float) -> float:
        return max(self._paused_until - now, 0.0)

    def _wait_estimate(
        self, ahead: int, pace: tuple[float, float | None] | None = None
    ) -> float | None:
        """Seconds until ``ahead + 1`` slots free up (None: too little measured to
        know): any pause, else by the rate at which slots free up (``_pace``)."""
        pause, rate = self._pace() if pace is None else pace
        if pause > 0:
            # After a restart one probe goes first: the rate of the old server says
            # nothing about the new one, so only the pause is certain.
            return pause
        return None if rate is None else (ahead + 1) / rate

    def _pace(self) -> tuple[float, float | None]:
        """The pause left, and the rate at which slots free up: the faster of the
        measured one (releases over the last 10 s) and the one the limit gives by
        Little's law (the limit, or the one slow start heads for, over the time a
        slot is held). The measured rate lags a rising limit: after a restart the
        limit doubles per round trip, and the releases of its first, small rounds
        would fail a backlog that has the time to wait. The time a slot is held is
        the mean of recent successes, or the mean age of the attempts in flight if
        that is longer: a server that stopped answering is not assumed to go on."""
        now = self.clock.now()
        releases = self._releases
        while releases and now - releases[0] > _RATE_WINDOW_S:
            releases.popleft()
        if len(releases) < _MIN_RATE_SAMPLES:
            return self._pause_left(now), None
        rate = len(releases) / max(now - releases[0], 1e-3)
        if self._holds:
            hold = sum(self._holds) / len(self._holds)
            if self._in_flight:
                hold = max(hold, now - self._granted_sum / self._in_flight)
            target = self._limit
            if self._limit < self._ssthresh < math.inf:
                target = self._ssthresh
            rate = max(rate, target / max(hold, 1e-3))
        return self._pause_left(now), rate

    def _grant_waiters(self) -> list[Callable[[], None]]:
        wakes: list[Callable[[], None]] = []
        now = self.clock.now()
        if self._pause_left(now) > 0:
            return wakes
        while self._queue and self._in_flight < self.limit:
            _, waiter = heapq.heappop(self._queue)
            if waiter.done:
                continue
            self._waiting -= 1
            wakes.append(waiter._resolve(self._grant(now - waiter.enqueued_at), None))
        return wakes

    def _sweep(self, now: float, *, force: bool = False) -> list[Callable[[], None]]:
        """Fail, at once, the waiters whose deadline the queue ahead cannot let them meet."""
        if not self._waiting or (now - self._last_sweep < _SWEEP_EVERY_S and not force):
            return []
        self._last_sweep = now
        wakes: list[Callable[[], None]] = []
        ahead = 0
        pace = self._pace()
        for _, waiter in sorted(self._queue, key=lambda item: item[0]):
            if waiter.done:
                continue
            estimate = self._wait_estimate(ahead, pace)
            if estimate is None:
                break
            if now + estimate > waiter.deadline_at:
                self._waiting -= 1
                self._refused += 1
                wakes.append(waiter._resolve(None, self._deadline_error(waiter, now, estimate)))
            else:
                ahead += 1
        return wakes

    def _deadline_error(
        self, waiter: SlotWaiter, now: float, estimate: float | None
    ) -> QueueTimeoutError:
        queued = now - waiter.enqueued_at
        where = (
            f"limit {self.limit}, {self._in_flight} in flight, {self._waiting} waiting"
            f", queued {queued:.2f} s"
        )
        if estimate is None:
            message = (
                f"The call's deadline passed while it waited for a slot of {self.name} ({where})"
            )
        else:
            left = max(waiter.deadline_at - now, 0.0)
            message = (
                f"No slot of {self.name} can be had before the call's deadline: an estimated"
                f" {estimate:.2f} s of waiting ahead, {left:.2f} s left ({where})"
            )
        return QueueTimeoutError(message, queued_s=queued, estimated_wait_s=estimate)

    # -- the waiter's side -------------------------------------------------------------

    def _on_wake(self, waiter: SlotWaiter, wake: Callable[[], None]) -> bool:
        """Give the waiter its wake-up; True when it is already settled (no need to wait)."""
        with self._lock:
            if waiter.done:
                return True
            waiter._wake = wake
            return False

    def _pause_for(self, waiter: SlotWaiter) -> float:
        """Seconds a waiter sleeps through the endpoint's pause (0: not paused), up to
        just after its end and never past the waiter's deadline."""
        with self._lock:
            now = self.clock.now()
            pause = self._pause_left(now)
        if pause <= 0:
            return 0.0
        return max(min(pause + 0.001, waiter.deadline_at - now), 0.0)

    def _resume(self, waiter: SlotWaiter) -> bool:
        """A waiter's sleep ran out: grant whoever may go now that a pause is over.
        True when the waiter is settled (granted, or failed by the sweep)."""
        self.poll()
        return waiter.done

    def poll(self) -> None:
        """Grant what may go now (a pause may have ended with nobody to notice)."""
        with self._lock:
            now = self.clock.now()
            wakes = self._grant_waiters() + self._sweep(now)
        _call_all(wakes)

    def _finish_wait(self, waiter: SlotWaiter) -> Lease:
        """After the wait: the lease, or the error (a deadline reached counts as one)."""
        with self._lock:
            if not waiter.done:
                now = self.clock.now()
                self._waiting -= 1
                self._refused += 1
                waiter._resolve(None, self._deadline_error(waiter, now, None))
        return waiter._outcome()

    def _abandon(self, waiter: SlotWaiter) -> None:
        """The waiting task was cancelled: leave the queue, hand back a granted slot."""
        with self._lock:
            if not waiter.done:
                self._waiting -= 1
                waiter._resolve(None, _CANCELLED)
                return
            lease = waiter._lease
        if lease is not None:
            lease.release()


_CANCELLED = QueueTimeoutError("The call was cancelled while it waited for a slot", queued_s=0.0)


def _call_all(wakes: list[Callable[[], None]]) -> None:
    for wake in wakes:
        wake()


class ConcurrencyLimiter:
    """Adaptive concurrency limits, one per endpoint, shared by every thread and task
    of the clients it is given to (pass one object to several clients to share it).

    >>> from stormguard.testing import FakeClock
    >>> limiter = ConcurrencyLimiter(initial_limit=2, clock=FakeClock())
    >>> a = limiter.endpoint("10.0.0.5:8000").acquire(1, 0, deadline_at=60.0)
    >>> b = limiter.endpoint("10.0.0.5:8000").acquire(1, 1, deadline_at=60.0)
    >>> c = limiter.endpoint("10.0.0.5:8000").acquire(1, 2, deadline_at=60.0)
    >>> type(a).__name__, type(c).__name__   # the third waits for a slot
    ('Lease', 'SlotWaiter')
    """

    def __init__(
        self,
        *,
        initial_limit: int = DEFAULT_INITIAL_LIMIT,
        min_limit: int = DEFAULT_MIN_LIMIT,
        max_limit: int = DEFAULT_MAX_LIMIT,
        backoff_ratio: float = DEFAULT_BACKOFF_RATIO,
        max_waiting: int = DEFAULT_MAX_WAITING,
        requeue_budget: RetryBudget | None = None,
        clock: Clock | None = None,
    ) -> None:
        for name, value in (
            ("initial_limit", initial_limit),
            ("min_limit", min_limit),
            ("max_limit", max_limit),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not min_limit <= initial_limit <= max_limit:
            raise ValueError(
                "the limits must satisfy min_limit <= initial_limit <= max_limit, got"
                f" {min_limit} / {initial_limit} / {max_limit}"
            )
        if not (isinstance(backoff_ratio, (int, float)) and 0.0 < backoff_ratio < 1.0):
            raise ValueError(f"backoff_ratio must be between 0 and 1, got {backoff_ratio!r}")
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an integer >= 0, got {max_waiting!r}")
        self.initial_limit = initial_limit
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.backoff_ratio = float(backoff_ratio)
        self.max_waiting = max_waiting
        self.clock = clock or Clock()
        self.rng = random.Random()
        #: Requeues of shed attempts are paid from this (Finagle's requeue budget);
        #: a shed it refuses is an ordinary retry, from the retry budget (10 %), so a
        #: server that sheds everything sees at most 1.15 attempts per call.
        self.requeue_budget = requeue_budget or RetryBudget(
            ratio=0.05, min_retries_per_second=0.1, clock=self.clock
        )
        self._endpoints: dict[str, EndpointLimit] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def endpoint(self, name: str) -> EndpointLimit:
        """The limit of endpoint ``name`` (``host:port``, or the ``Endpoint``'s name)."""
        limit = self._endpoints.get(name)
        if limit is None:
            with self._lock:
                limit = self._endpoints.setdefault(name, EndpointLimit(name, self))
        return limit

    def next_seq(self) -> int:
        """Arrival order of a new call (kept when it is requeued: it goes back in line
        where it stood, ahead of later arrivals)."""
        return next(self._seq)

    def state(self) -> tuple[LimitSnapshot, ...]:
        """Every endpoint's limit, in flight, waiting and decreases."""
        with self._lock:
            limits = list(self._endpoints.values())
        return tuple(limit.state() for limit in limits)

    def __repr__(self) -> str:
        return (
            f"ConcurrencyLimiter(initial_limit={self.initial_limit}, min_limit={self.min_limit},"
            f" max_limit={self.max_limit}, backoff_ratio={self.backoff_ratio},"
            f" max_waiting={self.max_waiting})"
        )
