"""Token-weighted admission with a bounded priority queue, in front of any engine.

A request's cost is its prompt tokens plus its ``max_tokens`` (the seed's
token_admission_load). It is admitted while the admitted cost fits the budget
(the engine's KV capacity x a watermark, scaled down during slow start);
otherwise it waits in a queue ordered by priority, then arrival, that is
bounded in requests, tokens and wait. When something must go, the victim is
the request that matters least: sheddable before standard before critical,
retries before first attempts, newest first. Every refusal says why and when
trying again makes sense, from how long admitted requests hold their tokens
and how long those in flight have held theirs (``wait_estimate.py``).

The controller knows no HTTP and no engine internals: it reads the engine's
``EngineLoad`` through a callable, and its clock (``clock.py``) is injectable,
so every decision, and the queue's timeouts, are unit-tested without sleeping.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from stormguard.protocol import Priority, ServerLoad, ShedReason
from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine import EngineLoad
from stormguard_server.wait_estimate import HoldMeter, ReleaseSchedule, wait_until_fits

_FALLBACK_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class Shed:
    """A refusal: the reason, when to come back, and whether coming back can help."""

    reason: ShedReason
    retry_after_s: float | None
    should_retry: bool
    message: str

    @property
    def status_code(self) -> int:
        """400 for what can never fit, 503 for overload and unreadiness."""
        return 400 if self.reason is ShedReason.TOO_LONG else 503


class ShedError(Exception):
    """Raised by ``acquire`` when a request is refused, now or while it waited."""

    def __init__(self, shed: Shed) -> None:
        super().__init__(shed.message)
        self.shed = shed


@dataclass(eq=False)
class Ticket:
    """One request asking for admission (identity is the object)."""

    cost: int
    priority: Priority = Priority.STANDARD
    attempt: int = 1
    # Tokens it may generate (part of the cost), when the front end knows them: the
    # wait estimate tells prefill from decoding with it.
    max_tokens: int | None = None
    # Absolute time (controller clock) after which the caller no longer waits.
    deadline: float | None = None
    arrival: float = 0.0
    seq: int = 0
    admitted_at: float | None = None
    # True from admission until release: its cost counts as in flight.
    inflight: bool = False
    # Place in the queue when it was queued (0 = next); None when admitted at once.
    queue_position: int | None = None
    future: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def is_retry(self) -> bool:
        return self.attempt > 1

    @property
    def shape(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) as far as known: the whole cost is taken for the
        prompt when max_tokens is not."""
        output = self.max_tokens or 0
        return max(0, self.cost - output), output

    @property
    def order_key(self) -> tuple[int, int]:
        """Serving order: priority, then arrival."""
        return (self.priority.rank, self.seq)

    @property
    def shed_key(self) -> tuple[int, bool, int]:
        """Shedding order (largest goes first): least important, retries, newest."""
        return (self.priority.rank, self.is_retry, self.seq)


@dataclass(frozen=True, slots=True)
class Grant:
    """Admission granted to a request; release it (``AdmissionController.release``)
    when the engine is done. ``waited_s`` and ``ticket.queue_position`` describe its wait
    (what a tracing span of the admission step records)."""

    ticket: Ticket
    waited_s: float


class DrainMeter:
    """Amounts released per second over the last ``period_s`` seconds (the request
    limits' pools measure their drain with it; admission's own wait estimate is
    ``HoldMeter``)."""

    def __init__(self, period_s: float, clock: ClockLike | None = None) -> None:
        self._period_s = period_s
        self._clock = as_clock(clock)
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0
        self._started: float | None = None

    def start(self) -> None:
        """Begin measuring (at the first admission): the rate's span starts here."""
        if self._started is None:
            self._started = self._clock.now()

    def record(self, tokens: int) -> None:
        now = self._clock.now()
        self.start()
        self._events.append((now, tokens))
        self._total += tokens
        self._trim(now)

    def rate(self) -> float | None:
        """Tokens per second, or None before anything was released."""
        now = self._clock.now()
        self._trim(now)
        if self._started is None or not self._events:
            return None
        span = min(self._period_s, max(now - self._started, 0.0))
        span = max(span, 0.1)  # one burst of releases is not an infinite rate
        return self._total / span

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self._period_s:
            _, tokens = self._events.popleft()
            self._total -= tokens


class _Group:
    """The queued tickets of one (priority rank, is_retry), sorted by seq.

    Their tokens also sit in a Fenwick tree indexed by seq, so "tokens of this
    group queued before seq s" costs O(log n) even when a ticket is submitted
    after later-made ones (it then queues ahead of them). The tree covers a
    range of seqs and is rebuilt, in O(range), when a seq falls outside it;
    the range is twice the queued span, so rebuilds are rare (amortized O(1)).
    Seqs are unique (``make_ticket`` stamps them) and costs never negative.
    """

    def __init__(self) -> None:
        self.tickets: list[Ticket] = []
        self.seqs: list[int] = []
        self.tokens = 0
        self._base = 0
        self._tree = [0]  # 1-based Fenwick tree over seqs base .. base + len - 2

    def insert(self, ticket: Ticket) -> None:
        at = bisect.bisect_right(self.seqs, ticket.seq)
        self.seqs.insert(at, ticket.seq)
        self.tickets.insert(at, ticket)
        self.tokens += ticket.cost
        if self._base <= ticket.seq < self._base + len(self._tree) - 1:
            self._add(ticket.seq, ticket.cost)
        else:
            self._rebuild()

    def remove(self, ticket: Ticket) -> None:
        at = bisect.bisect_left(self.seqs, ticket.seq)
        while self.tickets[at] is not ticket:
            at += 1
        del self.seqs[at], self.tickets[at]
        self.tokens -= ticket.cost
        self._add(ticket.seq, -ticket.cost)

    def tokens_before(self, seq: int) -> int:
        """Tokens of this group's tickets whose seq is below ``seq``."""
        i = min(seq - self._base, len(self._tree) - 1)
        total = 0
        while i > 0:
            total += self._tree[i]
            i -= i & -i
        return total

    def _add(self, seq: int, tokens: int) -> None:
        i, size = seq - self._base + 1, len(self._tree)
        while i < size:
            self._tree[i] += tokens
            i += i & -i

    def _rebuild(self) -> None:
        self._base = self.seqs[0]
        size = 64
        while size < 2 * (self.seqs[-1] - self._base + 1):
            size *= 2
        tree = [0] * (size + 1)
        for ticket in self.tickets:
            tree[ticket.seq - self._base + 1] += ticket.cost
        for i in range(1, size + 1):  # linear-time Fenwick construction
            parent = i + (i & -i)
            if parent <= size:
                tree[parent] += tree[i]
        self._tree = tree


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
        # The queue, sorted by order_key, with the keys alongside for bisect; the same
        # tickets by (rank, is_retry) with their token sums; each queued ticket's
        # shed_key as it was queued; and a heap of (expiry, push number, ticket) in
        # which tickets that left stay until they surface. No decision then scans the
        # queue: each is O(log n) in its length (list inserts and pops are memmoves).
        self._queue: list[Ticket] = []
        self._keys: list[tuple[int, int]] = []
        self._groups = self._new_groups()
        self._queued: dict[Ticket, tuple[int, bool, int]] = {}
        self._expiries: list[tuple[float, int, Ticket]] = []
        self._pushes = itertools.count()  # heap tie-break: tickets do not compare
        self._queue_tokens = 0
        self._inflight: dict[Ticket, None] = {}  # admitted, not yet released
        self._inflight_tokens = 0
        self._seq = itertools.count()
        self.holds = HoldMeter(config.drain_period_s, self._clock)
        # When the requests in flight are expected to end; None once they or the
        # hold times have changed (rebuilt by the next estimate).
        self._schedule: ReleaseSchedule | None = None

    # -- state ------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def queue_tokens(self) -> int:
        return self._queue_tokens

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
            queue_depth=len(self._queue),
            queue_tokens=self._queue_tokens,
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

        ahead_tokens = self._tokens_ahead(ticket)
        if ahead_tokens == 0 and self._fits(ticket.cost, load):
            return self._admit(ticket, now)

        if ticket.deadline is not None:
            wait = self._estimate_wait(ahead_tokens + ticket.cost, load)
            if wait is not None and now + wait > ticket.deadline:
                return Shed(
                    ShedReason.DEADLINE,
                    None,
                    False,
                    f"the request's deadline cannot be met (estimated queue wait {wait:.2f} s)",
                )
        if ticket.is_retry and self._retry_must_go(ticket):
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
        if self._remove(ticket):
            self.pump()
            return True
        return False

    def expire(self) -> list[Ticket]:
        """Shed queued tickets whose deadline or maximum wait has passed."""
        now = self._clock.now()
        expired: dict[Ticket, None] = {}  # a ticket queued twice has two entries
        while self._expiries and now >= self._expiries[0][0]:
            _, _, ticket = heapq.heappop(self._expiries)
            if ticket in self._queued:
                expired[ticket] = None
        gone = sorted(expired, key=self._order_key)  # shed in queue order
        for ticket in gone:
            self._remove(ticket)
            self._resolve(ticket, self._expired_shed(ticket))
        if gone:
            self.pump()
        return gone

    def pump(self) -> list[Ticket]:
        """Admit queued tickets from the head while they fit (strict order: no overtaking)."""
        load = self._engine_load()
        admitted: list[Ticket] = []
        if not load.ready:
            return admitted
        now = self._clock.now()
        while self._queue and self._fits(self._queue[0].cost, load):
            ticket = self._queue[0]
            self._remove(ticket)
            self._admit(ticket, now)
            self._resolve(ticket, None)
            admitted.append(ticket)
        return admitted

    def shed_all_queued(self, load: EngineLoad | None = None) -> list[Ticket]:
        """The engine went down: every queued ticket is refused with the restart reason."""
        load = load or self._engine_load()
        shed = self.unready_shed(load)
        gone = list(self._queue)
        self._queue.clear()
        self._keys.clear()
        self._groups = self._new_groups()
        self._queued.clear()
        self._expiries.clear()
        self._queue_tokens = 0
        for ticket in gone:
            self._resolve(ticket, shed)
        return gone

    def tick(self) -> None:
        """Periodic housekeeping: an engine that went down takes its queue with it;
        otherwise expire what waited too long and admit what now fits (the
        slow-start budget grows between releases)."""
        load = self._engine_load()
        if not load.ready:
            if self._queue:
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
            while not ticket.future.done():
                timeout = max(0.0, self._expiry(ticket) - self._clock.now())
                if not await self._clock.wait(ticket.future, timeout):
                    self.expire()
            ticket.future.result()
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

    def _admit(self, ticket: Ticket, now: float) -> Grant:
        ticket.admitted_at = now
        ticket.inflight = True
        self._inflight[ticket] = None
        self._inflight_tokens += ticket.cost
        self._schedule = None
        return Grant(ticket, waited_s=now - ticket.arrival)

    def _enqueue(self, ticket: Ticket, load: EngineLoad) -> Shed | None:
        cfg = self.config
        over_requests = len(self._queue) + 1 > cfg.max_queue_requests
        over_tokens = self._queue_tokens + ticket.cost > cfg.max_queue_tokens
        if over_requests or over_tokens:
            reason = ShedReason.QUEUE_FULL if over_requests else ShedReason.TOKEN_BUDGET
            victims = self._victims_for(ticket)
            if victims is None:
                return self._overload_shed(ticket, reason, load)
            for victim in victims:
                self._remove(victim)
                self._resolve(victim, self._overload_shed(victim, reason, load))
        ticket.future = asyncio.get_running_loop().create_future()
        rank, retry, seq = self._queued[ticket] = ticket.shed_key
        at = bisect.bisect_right(self._keys, (rank, seq))
        self._keys.insert(at, (rank, seq))
        self._queue.insert(at, ticket)
        self._groups[rank, retry].insert(ticket)
        heapq.heappush(self._expiries, (self._expiry(ticket), next(self._pushes), ticket))
        if len(self._expiries) > 2 * len(self._queue) + 64:  # without expire() calls too
            self._expiries = [e for e in self._expiries if e[2] in self._queued]
            heapq.heapify(self._expiries)
        ticket.queue_position = at
        self._queue_tokens += ticket.cost
        return None

    def _victims_for(self, newcomer: Ticket) -> list[Ticket] | None:
        """Queued tickets that matter less than ``newcomer`` and whose removal makes
        room for it; None when the newcomer itself is the one to shed.

        Candidates are the tickets with a larger shed_key, taken largest first: every
        ticket of the groups (rank, is_retry) above the newcomer's, newest first, then
        those of its own group newer than it. The totals decide up front whether
        removing them all makes room (costs are never negative, so otherwise no
        subset does); then only the victims themselves are visited.
        """
        cfg = self.config
        rank, retry, seq = newcomer.shed_key
        own = self._groups[rank, retry]
        above = [g for key, g in self._groups.items() if key > (rank, retry)]
        depth = len(self._queue) - sum(len(g.seqs) for g in above)
        depth -= len(own.seqs) - bisect.bisect_right(own.seqs, seq)
        tokens = self._queue_tokens - sum(g.tokens for g in above)
        tokens -= own.tokens - own.tokens_before(seq + 1)
        if depth + 1 > cfg.max_queue_requests or tokens + newcomer.cost > cfg.max_queue_tokens:
            return None
        victims: list[Ticket] = []
        depth, tokens = len(self._queue), self._queue_tokens
        for key, group in reversed(self._groups.items()):
            if key < (rank, retry):
                break
            first = bisect.bisect_right(group.seqs, seq) if group is own else 0
            for i in range(len(group.tickets) - 1, first - 1, -1):
                if (
                    depth + 1 <= cfg.max_queue_requests
                    and tokens + newcomer.cost <= cfg.max_queue_tokens
                ):
                    return victims
                victims.append(group.tickets[i])
                depth -= 1
                tokens -= group.tickets[i].cost
        return victims

    def _retry_must_go(self, ticket: Ticket) -> bool:
        limit = self.config.max_queue_requests * self.config.retry_queue_fraction
        ahead = bisect.bisect_left(self._keys, ticket.order_key)
        return ahead >= limit

    def _tokens_ahead(self, ticket: Ticket) -> int:
        """Tokens queued before ``ticket`` would be: every group of a lower rank, and
        the tickets of its own rank made before it."""
        rank, seq = ticket.order_key
        return sum(
            group.tokens if key[0] < rank else group.tokens_before(seq)
            for key, group in self._groups.items()
            if key[0] <= rank
        )

    def _order_key(self, ticket: Ticket) -> tuple[int, int]:
        """A queued ticket's order_key as it was queued."""
        rank, _, seq = self._queued[ticket]
        return rank, seq

    @staticmethod
    def _new_groups() -> dict[tuple[int, bool], _Group]:
        """An empty group per (rank, is_retry), in ascending order (shedding takes
        them from the end)."""
        keys = sorted((p.rank, retry) for p in Priority for retry in (False, True))
        return {key: _Group() for key in keys}

    def _overload_shed(self, ticket: Ticket, reason: ShedReason, load: EngineLoad) -> Shed:
        wait = self._estimate_wait(self._queue_tokens + ticket.cost, load)
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
        if ticket.deadline is not None and ticket.deadline <= self._expiry(ticket):
            return Shed(ShedReason.DEADLINE, None, False, "deadline passed while queued")
        load = self._engine_load()
        return self._overload_shed(ticket, ShedReason.DEADLINE, load)

    def _expiry(self, ticket: Ticket) -> float:
        limit = ticket.arrival + self.config.max_queue_wait_s
        return limit if ticket.deadline is None else min(limit, ticket.deadline)

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

    def _remove(self, ticket: Ticket) -> bool:
        """Take a ticket out of the queue (its heap entry stays until it expires)."""
        key = self._queued.pop(ticket, None)
        if key is None:
            return False
        rank, retry, seq = key
        at = bisect.bisect_left(self._keys, (rank, seq))
        while self._queue[at] is not ticket:
            at += 1
        del self._queue[at], self._keys[at]
        self._groups[rank, retry].remove(ticket)
        self._queue_tokens -= ticket.cost
        return True

    @staticmethod
    def _resolve(ticket: Ticket, shed: Shed | None) -> None:
        future = ticket.future
        if future is None or future.done():
            return
        if shed is None:
            future.set_result(None)
        else:
            future.set_exception(ShedError(shed))
