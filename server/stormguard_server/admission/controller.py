"""Token-weighted admission with a bounded priority queue, in front of any engine.

A request's cost is its prompt tokens plus its ``max_tokens``: the KV tokens it
may hold. It is admitted while the admitted cost fits the budget
(the engine's KV capacity x a watermark, scaled down during slow start);
otherwise it waits in a queue ordered by priority, then arrival, that is
bounded in requests, tokens and wait (``queue.py``). When something
must go, the victim is the request that matters least: sheddable before
standard before critical, retries before first attempts, newest first. Every
refusal says why and when trying again makes sense, from how long admitted
requests hold their tokens and how long those in flight have held theirs
(``wait_estimate.py``).

The controller knows no HTTP and no engine internals: it reads the engine's
``EngineLoad`` through a callable, and its clock (``clock.py``) is injectable,
so every decision, and the queue's timeouts, are unit-tested without sleeping.
The values it trades in (``Ticket``, ``Grant``, ``Shed``, ``ShedError``) live in
``tickets.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from stormguard.protocol import Priority, ServerLoad, ShedReason
from stormguard_server.admission.queue import AdmissionQueue
from stormguard_server.admission.tickets import Grant, Shed, ShedError, Ticket
from stormguard_server.admission.wait_estimate import HoldMeter, ReleaseSchedule, wait_until_fits
from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine.base import EngineLoad

if TYPE_CHECKING:
    from stormguard_server.admission.queue import _Group

__all__ = ["AdmissionController"]

_FALLBACK_RETRY_AFTER_S = 1.0


class AdmissionController:
    """Admits, queues or sheds tickets; see the module docstring."""

    def __init__(
        self,
        config: AdmissionConfig,
        engine_load: Callable[[], EngineLoad],
        *,
        clock: ClockLike | None = None,
    ) -> None:
        self.config = config
        self._engine_load = engine_load
        self._clock = as_clock(clock)
        self._waiting = AdmissionQueue(config)
        self._inflight: dict[Ticket, None] = {}  # admitted, not yet released
        self._inflight_tokens = 0
        self._seq = itertools.count()
        self.holds = HoldMeter(config.drain_period_s, self._clock)
        # When the requests in flight are expected to end; None once they or the
        # hold times have changed (rebuilt by the next estimate).
        self._schedule: ReleaseSchedule | None = None
        # The queue's one timer (a task sleeping on the clock until the earliest
        # expiry) and when it rings.
        self._watcher: asyncio.Task[None] | None = None
        self._watch_at = math.inf

    # -- state ------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def queue_tokens(self) -> int:
        return self._waiting.tokens

    @property
    def inflight_tokens(self) -> int:
        return self._inflight_tokens

    def full_budget(self, load: EngineLoad | None = None) -> int:
        """Tokens admitted at most when the engine runs at full capacity."""
        load = load or self._engine_load()
        return math.floor(load.kv_capacity_tokens * self.config.kv_watermark)

    def budget(self, load: EngineLoad | None = None) -> int:
        """Tokens admitted at most now (smaller during slow start)."""
        load = load or self._engine_load()
        return math.floor(self.full_budget(load) * load.capacity_factor)

    def server_load(self) -> ServerLoad:
        """The load headers' values right now."""
        load = self._engine_load()
        return ServerLoad(
            queue_depth=len(self._waiting),
            queue_tokens=self._waiting.tokens,
            inflight_tokens=self._inflight_tokens,
            token_capacity=self.budget(load),
            kv_cache_usage=load.kv_cache_usage,
        )

    # -- decisions (synchronous) ------------------------------------------

    def make_ticket(
        self,
        cost: int,
        *,
        priority: Priority = Priority.STANDARD,
        attempt: int = 1,
        deadline_ms: float | None = None,
        max_tokens: int | None = None,
    ) -> Ticket:
        """A ticket stamped with arrival time and order.

        The cost is counted in whole KV blocks (rounded up to the engine's block
        size), as the engine allocates them: admitted work then always fits the
        cache, however many sequences share it. ``max_tokens`` (part of the cost)
        sharpens the wait estimate: a token generated takes longer than one of prompt.
        """
        now = self._clock.now()
        deadline = None if deadline_ms is None else now + deadline_ms / 1000.0
        block = max(1, self._engine_load().kv_block_size)
        return Ticket(
            cost=-(-cost // block) * block,
            priority=priority,
            attempt=attempt,
            deadline=deadline,
            arrival=now,
            seq=next(self._seq),
            max_tokens=max_tokens,
        )

    def submit(self, ticket: Ticket) -> Grant | Shed | None:
        """Admit now (Grant), refuse now (Shed), or queue (None: wait on ``ticket.future``)."""
        now = self._clock.now()
        load = self._engine_load()
        if ticket.cost > self.full_budget(load):
            return Shed(
                ShedReason.TOO_LONG,
                None,
                False,
                f"request needs {ticket.cost} tokens (prompt + max_tokens); the server "
                f"admits at most {self.full_budget(load)}",
            )
        if not load.ready:
            return self.unready_shed(load)
        if ticket.deadline is not None and ticket.deadline <= now:
            return Shed(ShedReason.DEADLINE, None, False, "the request's deadline has passed")

        # The tokens queued ahead are counted only when they decide something: when
        # the ticket fits (it is admitted only if nothing waits ahead of it) and for
        # a deadline's estimate. A ticket that does not fit queues whatever they are.
        ahead_tokens: int | None = None
        if self._fits(ticket.cost, load):
            ahead_tokens = self._waiting.tokens_ahead(ticket)
            if ahead_tokens == 0:
                self._admit(ticket, now)
                return Grant(ticket, waited_s=now - ticket.arrival)

        if ticket.deadline is not None:
            if ahead_tokens is None:
                ahead_tokens = self._waiting.tokens_ahead(ticket)
            wait = self._estimate_wait(ahead_tokens + ticket.cost, load)
            if wait is not None and now + wait > ticket.deadline:
                return Shed(
                    ShedReason.DEADLINE,
                    None,
                    False,
                    f"the request's deadline cannot be met (estimated queue wait {wait:.2f} s)",
                )
        if ticket.is_retry and self._waiting.retry_must_go(ticket):
            return self._overload_shed(ticket, ShedReason.QUEUE_FULL, load)
        return self._enqueue(ticket, load)

    def release(self, grant: Grant, *, served: bool = True) -> None:
        """An admitted request ended: its tokens come back, queued ones may enter.
        ``served=False``: the engine failed it (a crash) or it never ran, so its hold
        says nothing about how long requests take and is not measured."""
        ticket = grant.ticket
        if not ticket.inflight:
            return
        ticket.inflight = False
        self._inflight.pop(ticket, None)
        self._inflight_tokens -= ticket.cost
        if served and ticket.admitted_at is not None:
            self.holds.record(ticket.cost, *ticket.shape, self._clock.now() - ticket.admitted_at)
        self._schedule = None
        self.pump()

    def cancel(self, ticket: Ticket) -> bool:
        """Remove a queued ticket (its caller went away); True when it was queued."""
        if self._waiting.remove(ticket):
            self.pump()
            return True
        return False

    def expire(self) -> list[Ticket]:
        """Shed queued tickets whose deadline or maximum wait has passed."""
        gone = self._waiting.due(self._clock.now())  # shed in queue order
        for ticket in gone:
            self._waiting.remove(ticket)
            self._resolve(ticket, self._expired_shed(ticket))
        if gone:
            self.pump()
        return gone

    def pump(self) -> list[Ticket]:
        """Admit queued tickets from the head while they fit (strict order: no overtaking)."""
        admitted: list[Ticket] = []
        queue = self._waiting.tickets
        if not queue:
            return admitted
        load = self._engine_load()
        if not load.ready:
            return admitted
        now = self._clock.now()
        budget = self.budget(load)
        while queue and (not self._inflight or self._inflight_tokens + queue[0].cost <= budget):
            ticket = queue[0]  # _fits, with the budget read once
            self._waiting.remove(ticket)
            self._admit(ticket, now)
            self._resolve(ticket, None)
            admitted.append(ticket)
        return admitted

    def shed_all_queued(self, load: EngineLoad | None = None) -> list[Ticket]:
        """The engine went down: every queued ticket is refused with the restart reason."""
        load = load or self._engine_load()
        shed = self.unready_shed(load)
        gone = self._waiting.clear()
        for ticket in gone:
            self._resolve(ticket, shed)
        return gone

    def tick(self) -> None:
        """Periodic housekeeping: an engine that went down takes its queue with it;
        otherwise expire what waited too long and admit what now fits (the
        slow-start budget grows between releases)."""
        load = self._engine_load()
        if not load.ready:
            if self._waiting:
                self.shed_all_queued(load)
            return
        self.expire()
        self.pump()

    # -- waiting (asyncio) ------------------------------------------------

    async def acquire(self, ticket: Ticket) -> Grant:
        """Wait for admission; raises ``ShedError``. Cancelling it leaves the queue."""
        decision = self.submit(ticket)
        if isinstance(decision, Grant):
            return decision
        if isinstance(decision, Shed):
            raise ShedError(decision)
        assert ticket.future is not None
        try:
            # Resolved by whatever settles the ticket: admission (pump), a shed, or
            # its wait running out (the queue's one timer, ``_expire_when_due``). The
            # task wakes once, when that happens: awaiting the future itself puts
            # no callback or timer of its own between the release and the waiter.
            await ticket.future
        except asyncio.CancelledError:
            if not self.cancel(ticket) and ticket.inflight:
                self.release(Grant(ticket, 0.0), served=False)  # admitted as it left
            raise
        return Grant(ticket, waited_s=max(0.0, (ticket.admitted_at or 0.0) - ticket.arrival))

    # -- internals --------------------------------------------------------

    def _fits(self, cost: int, load: EngineLoad) -> bool:
        # An idle engine takes any request that passed the too_long check, so
        # a small slow-start budget can never wedge a large request forever.
        return not self._inflight or self._inflight_tokens + cost <= self.budget(load)

    def _admit(self, ticket: Ticket, now: float) -> None:
        ticket.admitted_at = now
        ticket.inflight = True
        self._inflight[ticket] = None
        self._inflight_tokens += ticket.cost
        self._schedule = None

    def _enqueue(self, ticket: Ticket, load: EngineLoad) -> Shed | None:
        reason = self._waiting.overflow(ticket.cost)
        if reason is not None:
            victims = self._waiting.victims_for(ticket)
            if victims is None:
                return self._overload_shed(ticket, reason, load)
            for victim in victims:
                self._waiting.remove(victim)
                self._resolve(victim, self._overload_shed(victim, reason, load))
        loop = asyncio.get_running_loop()
        ticket.future = loop.create_future()
        ticket.queue_position = self._waiting.push(ticket)
        self._watch_expiry(self._waiting.expiry(ticket), loop)
        return None

    def _watch_expiry(self, at: float, loop: asyncio.AbstractEventLoop) -> None:
        """Have the queue's timer ring by ``at``: a new timer only when none is set on
        this loop or the one set rings later (a deadline sooner than every queued
        ticket's expiry), so a queue of n waiters has one timer, not n."""
        watcher = self._watcher
        if watcher is not None and not watcher.done() and watcher.get_loop() is loop:
            if self._watch_at <= at:
                return
            watcher.cancel()
        self._watch_at = at
        self._watcher = loop.create_task(self._expire_when_due(), name="admission-expiry")

    async def _expire_when_due(self) -> None:
        """Shed queued tickets as their wait runs out, sleeping on the clock until the
        earliest expiry in the queue; ends when the queue is empty."""
        while (at := self._waiting.next_expiry()) is not None:
            self._watch_at = at
            await self._clock.sleep(at - self._clock.now())
            self.expire()

    def _overload_shed(self, ticket: Ticket, reason: ShedReason, load: EngineLoad) -> Shed:
        wait = self._estimate_wait(self._waiting.tokens + ticket.cost, load)
        retry_after = self._clamp(wait if wait is not None else _FALLBACK_RETRY_AFTER_S)
        if ticket.is_retry:
            return Shed(
                ShedReason.RETRY_SHED,
                retry_after,
                False,
                "server overloaded: retries are shed first; do not retry this call now",
            )
        return Shed(reason, retry_after, True, f"server overloaded ({reason.value})")

    def unready_shed(self, load: EngineLoad) -> Shed:
        """The refusal while the engine is not ready: restarting, warming or draining,
        with Retry-After = the engine's own estimate of when it is back."""
        restarting = load.state == "restarting"
        reason = ShedReason.ENGINE_RESTART if restarting else ShedReason.WARMING
        if load.state == "stopped":
            reason = ShedReason.DRAINING
        ready_in = load.ready_in_s if load.ready_in_s is not None else _FALLBACK_RETRY_AFTER_S
        return Shed(reason, self._clamp(ready_in), True, f"engine not ready ({load.state})")

    def _expired_shed(self, ticket: Ticket) -> Shed:
        if ticket.deadline is not None and ticket.deadline <= self._waiting.expiry(ticket):
            return Shed(ShedReason.DEADLINE, None, False, "deadline passed while queued")
        load = self._engine_load()
        return self._overload_shed(ticket, ShedReason.DEADLINE, load)

    def _estimate_wait(self, tokens_needed: int, load: EngineLoad) -> float | None:
        """Seconds until ``tokens_needed`` more tokens fit (``wait_until_fits``): each
        request in flight is expected to end its measured hold after its admission;
        None before any request has ended."""
        model, mean_hold = self.holds.model(), self.holds.mean_hold_s()
        if model is None or mean_hold is None:
            return None
        free = max(0, self.budget(load) - self._inflight_tokens)
        if tokens_needed <= free:
            return 0.0
        if self._schedule is None:
            self._schedule = ReleaseSchedule(
                ((t.admitted_at or 0.0) + model.hold_s(*t.shape), t.cost) for t in self._inflight
            )
        return wait_until_fits(tokens_needed, free, self._schedule, mean_hold, self._clock.now())

    def _clamp(self, seconds: float) -> float:
        return min(max(seconds, self.config.min_retry_after_s), self.config.max_retry_after_s)

    @staticmethod
    def _resolve(ticket: Ticket, shed: Shed | None) -> None:
        future = ticket.future
        if future is None or future.done():
            return
        if shed is None:
            future.set_result(None)
        else:
            future.set_exception(ShedError(shed))

    # -- the queue's bookkeeping, under the names its property tests read ---

    @property
    def _queue(self) -> list[Ticket]:
        return self._waiting.tickets

    @property
    def _keys(self) -> list[tuple[int, int]]:
        return self._waiting.keys

    @property
    def _queued(self) -> dict[Ticket, tuple[int, bool, int]]:
        return self._waiting.queued

    @property
    def _expiries(self) -> list[tuple[float, int, Ticket]]:
        return self._waiting.expiries

    @property
    def _groups(self) -> dict[tuple[int, bool], _Group]:
        return self._waiting.groups

    def _expiry(self, ticket: Ticket) -> float:
        return self._waiting.expiry(ticket)

    def _tokens_ahead(self, ticket: Ticket) -> int:
        return self._waiting.tokens_ahead(ticket)

    def _retry_must_go(self, ticket: Ticket) -> bool:
        return self._waiting.retry_must_go(ticket)

    def _victims_for(self, newcomer: Ticket) -> list[Ticket] | None:
        return self._waiting.victims_for(newcomer)
