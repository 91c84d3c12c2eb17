"""The concurrency limit of one endpoint and its local queue: ``EndpointLimit``.

A call takes a slot (``acquire``) or waits in the queue for one (a
``SlotWaiter``); an attempt gives it back (``release``) with its outcome, which
moves the limit (``_policies/limiter/aimd.py``) and wakes whoever may go now.

The queue: ordered by priority (critical, standard, sheddable), then arrival;
bounded (``max_waiting``); exactly one waiter woken per freed slot, more when
the limit rises. A waiter whose deadline cannot be met by the measured rate at
which slots free up is failed at once, and told so; nobody waits to the
deadline to fail (the pitfalls of Netflix's ``BlockingLimiter``, which waits
up to an hour, wakes every waiter at once and keeps no order).

The limiter that holds one limit per endpoint (``_policies/limiter/limiter.py``) builds on this
module; an ``EndpointLimit`` knows it only as a ``LimitTable``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..._core.exceptions import LocalQueueFullError, QueueTimeoutError
from ..._core.fork import forget_in_child, fork_safe_lock
from ..._core.verdict import LimitOutcome
from .aimd import AimdLimit, LimitSettings
from .lease import Lease
from .slot_waiter import SlotWaiter

if TYPE_CHECKING:
    from ..._core.clock import Clock

__all__ = ["EndpointLimit", "LimitSnapshot", "LimitTable"]

#: How far back the rate at which slots free up is measured.
_RATE_WINDOW_S = 10.0
_RATE_SAMPLES = 512
#: Releases needed before the rate is trusted to fail a waiter early.
_MIN_RATE_SAMPLES = 4
_HOLD_SAMPLES = 64
#: The hopeless-waiter sweep runs at most this often.
_SWEEP_EVERY_S = 0.1
#: Waiters that left may stay in the queue up to twice those still waiting, plus this.
_QUEUE_SLACK = 64


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
    #: Seconds the endpoint stays paused (a restart shed's Retry-After, a spent quota's
    #: reset; 60 s at most); 0: not paused.
    paused_for: float = 0.0


class LimitTable(LimitSettings, Protocol):
    """The limiter that holds an endpoint's limit (``ConcurrencyLimiter``, in
    ``_policies/limiter/limiter.py``, which builds on this module): its options and clock, and its
    table of limits, asked for the current entry by a call that holds a dropped one
    and told when a forgotten entry's last call is done."""

    clock: Clock
    max_waiting: int

    def endpoint(self, name: str) -> EndpointLimit:
        """The table's limit of endpoint ``name``."""
        ...

    def _drop(self, limit: EndpointLimit) -> None:
        """A forgotten endpoint's last attempt or waiter is done: drop it now."""
        ...


class EndpointLimit:
    """The adaptive limit and local queue of one endpoint (thread-safe)."""

    def __init__(self, name: str, owner: LimitTable) -> None:
        self.name = name
        self.clock = owner.clock
        self._owner = owner
        self._lock = fork_safe_lock()
        #: The limit itself and how outcomes move it (``_policies/limiter/aimd.py``).
        self._aimd = AimdLimit(owner)
        self._in_flight = 0
        self._queue: list[tuple[tuple[int, int], SlotWaiter]] = []
        self._waiting = 0
        self._refused = 0
        self._releases: deque[float] = deque(maxlen=_RATE_SAMPLES)
        #: How long recent successes held their slot (Little's law: limit / hold = rate).
        self._holds: deque[float] = deque(maxlen=_HOLD_SAMPLES)
        self._granted_sum = 0.0  # of the grant times of the attempts in flight
        self._last_sweep = -math.inf
        #: When a call last took or gave back a slot here (the table drops the oldest).
        self.used_at = self.clock.now()
        #: Dropped from the limiter's table: a call that still holds this object
        #: asks the table's entry instead.
        self._retired = False
        #: The endpoint left the client's set: dropped once nothing uses it.
        self._forgotten = False
        forget_in_child(self)

    def _forget_parent_calls(self) -> None:
        """In a forked child: the parent's attempts in flight and calls waiting will
        never give their slots back here (``_core/fork.py``); the limit learned stays."""
        self._in_flight = 0
        self._queue = []
        self._waiting = 0
        self._granted_sum = 0.0

    @property
    def limit(self) -> int:
        return self._aimd.limit

    def full_without(self, held: int = 1) -> bool:
        """Whether a call that gives back the ``held`` slots it has would still have to
        wait for one: the endpoint is paused, other calls fill the limit, or wait already."""
        with self._lock:
            return (
                self._aimd.pause_left(self.clock.now()) > 0
                or self._in_flight - held >= self.limit
                or self._waiting > 0
            )

    def went_down(self) -> None:
        """The endpoint stopped serving (its breaker opened): when calls return to it,
        the limit starts from the bottom and slow-starts back up to half of what it
        was, as after a restart, so a recovering server is not handed its old load
        at once."""
        with self._lock:
            self._aimd.fall_to_floor()

    def has_room(self) -> bool:
        with self._lock:
            return (
                self._in_flight < self.limit
                and self._waiting == 0
                and self._aimd.pause_left(self.clock.now()) == 0
            )

    def recovering(self) -> bool:
        """Whether the limit is ramping back up after the endpoint went down (its
        breaker opened, it was ejected, its engine restarted): it takes only what its
        slow start allows, and a client with another tier sends the rest there."""
        with self._lock:
            return self._aimd.recovering

    def wait_fits(self, deadline_at: float) -> bool:
        """Whether a call queued last here now would get a slot by ``deadline_at``, by
        the estimate that refuses a waiter early (True when too little is measured)."""
        with self._lock:
            estimate = self._wait_estimate(self._waiting)
            return estimate is None or self.clock.now() + estimate <= deadline_at

    def expected_wait(self) -> float:
        """Waiters per slot plus any pause: a rough cost of queueing here, for choosing
        an endpoint."""
        with self._lock:
            queued = (self._waiting + max(self._in_flight - self.limit + 1, 0)) / self.limit
            return queued + self._aimd.pause_left(self.clock.now())

    def acquire(self, rank: int, seq: int, deadline_at: float) -> Lease | SlotWaiter:
        """A slot now, or a waiter to wait on; raises ``LocalQueueFullError`` when the
        queue is full and ``QueueTimeoutError`` when the deadline cannot be met."""
        wakes: list[Callable[[], None]] = []
        with self._lock:
            retired = self._retired
            if not retired:
                now = self.used_at = self.clock.now()
                if (
                    self._in_flight < self.limit
                    and not self._waiting
                    and not self._aimd.pause_left(now)
                ):
                    return self._grant(0.0)
                waiter = self._enqueue(SlotWaiter(self, (rank, seq), deadline_at), now)
                wakes = self._grant_waiters()
        if retired:
            # Dropped from the table since the caller looked it up: the table's entry
            # for this endpoint (made anew) counts the slot, not this orphan.
            return self._owner.endpoint(self.name).acquire(rank, seq, deadline_at)
        _call_all(wakes)
        return waiter

    def _enqueue(self, waiter: SlotWaiter, now: float) -> SlotWaiter:
        """Under the lock: queue a call that must wait, or refuse it."""
        if self._waiting >= self._owner.max_waiting:
            self._refused += 1
            raise LocalQueueFullError(
                f"{self._waiting} calls already wait for a slot of {self.name}"
                f" (max_waiting={self._owner.max_waiting})",
                endpoint=self.name,
                waiting=self._waiting,
            )
        estimate = self._wait_estimate(self._waiting)  # as if last in line: cheap
        if estimate is not None and now + estimate > waiter.deadline_at:
            ahead = sum(1 for key, w in self._queue if key < waiter.key and not w.done)
            estimate = self._wait_estimate(ahead)
            if estimate is not None and now + estimate > waiter.deadline_at:
                self._refused += 1
                raise self._deadline_error(waiter, now, estimate)
        if len(self._queue) > 2 * self._waiting + _QUEUE_SLACK:
            # Waiters that left (refused, timed out, cancelled) stay in the heap until
            # popped, which a full endpoint never does: sweep them out, amortised.
            self._queue = [item for item in self._queue if not item[1].done]
            heapq.heapify(self._queue)
        heapq.heappush(self._queue, (waiter.key, waiter))
        self._waiting += 1
        return waiter

    def release(self, lease: Lease) -> None:
        """An attempt gave its slot back: adapt the limit, wake whoever may go now."""
        with self._lock:
            self._in_flight -= 1
            self._granted_sum = self._granted_sum - lease.granted_at if self._in_flight else 0.0
            now = self.used_at = self.clock.now()
            outcome = lease.outcome
            paused_until = self._aimd.paused_until
            self._releases.append(now)  # every release frees a slot: the queue's pace
            if outcome is LimitOutcome.SUCCESS:
                self._holds.append(now - lease.granted_at)
                self._aimd.succeeded(lease)
            elif outcome is LimitOutcome.DROPPED:
                self._aimd.dropped(lease, now, self._in_flight)
            elif outcome is LimitOutcome.CUT:
                self._aimd.dropped(lease, now, self._in_flight, refused=False)
            elif outcome is LimitOutcome.RESTARTING:
                self._aimd.restarted(now, lease.load)
            wakes = self._grant_waiters()
            if self._aimd.paused_until > paused_until:
                wakes += self._pause_began(now)
            else:
                wakes += self._sweep(now)
            drop = self._forgotten and self._unused()
        _call_all(wakes)
        if drop:
            self._owner._drop(self)

    def pause(self, seconds: float) -> None:
        """The server said this endpoint takes no call for ``seconds`` (its quota is
        spent until a reset): no slot is granted until then, at most
        ``MAX_PAUSE_S`` (``AimdLimit.pause``). The limit does not move: a quota is
        the caller's, not the server's load."""
        wakes: list[Callable[[], None]] = []
        with self._lock:
            now = self.clock.now()
            paused_until = self._aimd.paused_until
            self._aimd.pause(now, seconds)
            if self._aimd.paused_until > paused_until:
                wakes = self._pause_began(now)
        _call_all(wakes)

    def state(self) -> LimitSnapshot:
        with self._lock:
            return LimitSnapshot(
                endpoint=self.name,
                limit=self.limit,
                in_flight=self._in_flight,
                waiting=self._waiting,
                slow_start=self._aimd.slow_start,
                decreases=self._aimd.decreases,
                refused=self._refused,
                paused_for=self._aimd.pause_left(self.clock.now()),
            )

    def _retire(self, *, forgotten: bool) -> bool:
        """Mark this entry dropped from the table if nothing uses it, and say so (the
        table's lock is held: the order is the table's, then this one's). One in
        use is kept: with ``forgotten`` (its endpoint left the client's set, so its
        pause protects nobody) it is dropped once its last attempt or waiter is
        done; without (the table is full), a pause running counts as use too."""
        with self._lock:
            if forgotten:
                self._forgotten = True
            elif self._aimd.pause_left(self.clock.now()) > 0:
                return False
            if self._unused():
                self._retired = True
            return self._retired

    # -- internals, all under the lock ------------------------------------------------

    def _unused(self) -> bool:
        return not self._in_flight and not self._waiting

    def _pause_began(self, now: float) -> list[Callable[[], None]]:
        """A pause that begins is news to every waiter: who cannot outlast it fails
        now, the others sleep through it."""
        wakes = self._sweep(now, force=True)
        return wakes + [w._wake for _, w in self._queue if not w.done and w._wake]

    def _grant(self, queued_s: float) -> Lease:
        self._in_flight += 1
        now = self.clock.now()
        self._granted_sum += now
        return Lease(self, self._aimd.epoch, self._in_flight, queued_s, now)

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
            return self._aimd.pause_left(now), None
        rate = len(releases) / max(now - releases[0], 1e-3)
        if self._holds:
            hold = sum(self._holds) / len(self._holds)
            if self._in_flight:
                hold = max(hold, now - self._granted_sum / self._in_flight)
            aimd = self._aimd
            target = aimd.value
            if aimd.value < aimd.ssthresh < math.inf:
                target = aimd.ssthresh
            rate = max(rate, target / max(hold, 1e-3))
        return self._aimd.pause_left(now), rate

    def _grant_waiters(self) -> list[Callable[[], None]]:
        wakes: list[Callable[[], None]] = []
        now = self.clock.now()
        if self._aimd.pause_left(now) > 0:
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
            pause = self._aimd.pause_left(now)
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
            drop = self._forgotten and self._unused()
        if drop:
            self._owner._drop(self)
        return waiter._outcome()

    def _abandon(self, waiter: SlotWaiter) -> None:
        """The waiting task was cancelled: leave the queue, hand back a granted slot."""
        with self._lock:
            if not waiter.done:
                self._waiting -= 1
                waiter._resolve(None, _CANCELLED)
                drop = self._forgotten and self._unused()
                lease = None
            else:
                drop, lease = False, waiter._lease
        if drop:
            self._owner._drop(self)
        if lease is not None:
            lease.release()


_CANCELLED = QueueTimeoutError("The call was cancelled while it waited for a slot", queued_s=0.0)


def _call_all(wakes: list[Callable[[], None]]) -> None:
    for wake in wakes:
        wake()
