"""``KeyQuota``: one key's (and model's) quota as this process paces to it, under one
lock: its two dimensions (``ShareController``), the 429-learned rate
(``CubicRate``), the pause a quota 429 asks for, and the calls waiting for it.

Its interface to the call (``reserve``, ``observe``, ``refused``, ``refund``,
``withdraw``) is the ``KeyState`` protocol (``_key_state``), which the state shared
between processes in Redis (``_shared.SharedKeyQuota``) offers too. It never sleeps:
``reserve`` returns a ``Pace`` (sleep this long, then send or ask again), and the
call flow sleeps it (``call_flow.Sleep``). A ``Grant`` is what a reservation in the
shared state took; this one is handed it and has nothing to do with it.

**Order.** Calls wait in ``x-priority`` order (critical, standard, sheddable),
then by arrival: a call may take the key's room only when no call before it in
that order waits. A call's wait counts the costs of the calls ahead of it, so it
asks again about when its turn comes, and at least every ``recheck`` seconds. A
waiter that stops asking (its task was cancelled without a word) is swept out
once it is 2 s late, and gets its place back if it asks again.

**Bounds.** The line never stands still for more than ``MAX_PAUSE_S`` (60 s), and
no answer pauses the key for longer: when the key has let no call go for that
long, the head of the line goes, and the provider's own answer decides; the calls
behind it wait their turns within their deadlines. A call fails at once
(``QuotaWaitError``) when even the whole key's rate (its refill since the last
``remaining``, and the pause a 429 asked for, unjittered) could not serve it before
its deadline: a lower bound, never this process's share, so no call is failed that
another process's silence would have let through.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from ..._core.exceptions import QuotaWaitError
from ..._core.fork import forget_in_child, fork_safe_lock
from ..limiter.aimd import MAX_PAUSE_S
from ._config import QuotaPolicy
from ._cubic import CubicRate
from ._share import ShareController
from ._signals import Reading, Refusal
from ._tally import SendTally

__all__ = ["DEFAULT_429_WAIT_S", "Grant", "KeyQuota", "Pace", "QuotaKey", "QuotaSnapshot"]

#: The wait after a quota 429 that names none (no Retry-After, no "try again in", no
#: spent limit's reset): AWS's and the prototype's.
DEFAULT_429_WAIT_S = 1.0
#: A waiter silent this long past its promised re-ask is swept out.
_SWEEP_GRACE_S = 2.0
#: The least sleep of a call that must wait.
_MIN_SLEEP_S = 0.01


@dataclass(frozen=True, slots=True)
class QuotaKey:
    """Whose quota: the fingerprint of the credential (or of the host, without one),
    the service's host and the model. Never the credential itself."""

    fingerprint: str
    host: str
    model: str
    #: False: no credential was sent; the host stands for the key.
    keyed: bool = True
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Looked up on every call: hashed once, not four fields each time.
        object.__setattr__(self, "_hash", hash((self.fingerprint, self.host, self.model)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, slots=True)
class Pace:
    """What ``reserve`` tells a call: sleep ``seconds``, then send (``granted``: its
    cost is taken) or ask again."""

    seconds: float
    granted: bool
    #: The first wait this key has asked of any call (logged once).
    first_wait: bool = False


@dataclass(slots=True)
class Grant:
    """What one attempt's reservation in a bucket shared in Redis (``SharedKeyQuota``)
    took, to be given back if it was not charged."""

    cost: float
    #: The local ``KeyQuota`` took it too (the shared bucket knew no limit).
    local: bool
    #: What the shared bucket took: the cost from its tokens, one from its requests
    #: (False: that dimension knew no limit, so the bucket took nothing from it).
    tokens: bool = False
    requests: bool = False
    #: Settled already: an attempt is unsent, refused, not charged or trued up, once.
    returned: bool = False


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    """A frozen copy of one key's quota as this process paces to it (``client.stats()``)."""

    #: The key's fingerprint (first 12 hex digits of its SHA-256); never the key.
    key: str
    model: str
    host: str
    #: ``"headers"``: paced to the ``x-ratelimit-*`` headers; ``"429s"``: to the rate
    #: learned from 429s alone; ``"off"``: no signal yet.
    mode: str
    #: The key's limits per minute, as the provider last said (None: not said).
    limit_tokens: float | None
    limit_requests: float | None
    #: What the key had left, at the last answer.
    remaining_tokens: float | None
    remaining_requests: float | None
    #: This process's measured share of the key, per dimension (1.0 before any).
    share_tokens: float
    share_requests: float
    #: The rate this process paces to now (tokens and requests per second; None:
    #: not paced in that dimension).
    rate_tokens: float | None
    rate_requests: float | None
    #: Calls waiting for the key now.
    waiting: int
    #: Calls that had to wait, and the seconds they waited in all.
    waits: int
    wait_s: float
    #: Quota 429s answered to this process, and calls failed for want of time.
    paced_429s: int
    refused: int
    #: Seconds until a 429's pause ends (0: none).
    paused_for: float
    #: Who paces the key: ``"local"`` (this process, from what it sees), ``"host"``
    #: (a bucket this machine's processes share in files: ``share_on_host``),
    #: ``"redis"`` (a bucket shared in Redis: ``QuotaPolicy.redis_url``),
    #: ``"local-fallback"`` (this process, while the store does not answer).
    backend: str = "local"
    #: What this client multiplies a prompt's bytes / 4 by to estimate its tokens,
    #: learned from the provider's counts (1.0 before any).
    prompt_scale: float = 1.0


class KeyQuota:
    """One key's quota as this process paces to it (thread-safe; never sleeps)."""

    def __init__(
        self,
        key: QuotaKey,
        policy: QuotaPolicy,
        rng: random.Random | None = None,
        tally: SendTally | None = None,
    ):
        self.key = key
        #: What this process sent to the key before its pacing turned on.
        self._tally = tally
        self._policy = policy
        self._rng = rng or random.Random()
        self._lock = fork_safe_lock()
        shape = {"window": policy.window, "drain": policy.drain, "reserve": policy.reserve}
        self.tokens = ShareController(**shape)
        self.requests = ShareController(**shape)
        self.cubic = CubicRate()
        #: No call goes before this (a 429's pause, jittered), nor is any call failed
        #: for a wait shorter than ``_floor_until`` (the same pause, unjittered).
        self._not_before = -math.inf
        self._floor_until = -math.inf
        #: When the last call the key let go was to be sent.
        self._granted_at = -math.inf
        # The waiting calls, in (rank, arrival) order, and the cost of each.
        self._order: list[tuple[int, int]] = []
        self._costs: list[float] = []
        self._asks: dict[tuple[int, int], float] = {}
        self._next_sweep = -math.inf
        self._waits = 0
        self._wait_s = 0.0
        self._paced_429s = 0
        self._refused = 0
        #: Whether a call has had to wait yet (the first wait is logged).
        self.waited = False
        forget_in_child(self)

    def _forget_parent_calls(self) -> None:
        """In a forked child: the parent's waiting calls will never ask again here."""
        self._order.clear()
        self._costs.clear()
        self._asks.clear()

    # -- the call's side -----------------------------------------------------------

    def reserve(
        self,
        ticket: tuple[int, int],
        cost: float,
        now: float,
        deadline: float,
        waited: float = 0.0,
    ) -> Pace:
        recheck = self._policy.recheck
        with self._lock:
            if now >= self._next_sweep:
                self._sweep(now)
            index = bisect.bisect_left(self._order, ticket)
            present = index < len(self._order) and self._order[index] == ticket
            least = self._least_wait(now, cost)
            ahead = sum(self._costs[:index])
            wait = max(
                self._not_before - now,
                self.tokens.wait(now, cost + ahead),
                self.requests.wait(now, 1.0 + index),
                self.cubic.wait(now, cost + ahead),
                0.0,
            )
            estimate = wait
            first_in_line = index == 0
            # How long the line has stood still for this call: since it came, or
            # since the key last let a call go, if that was later.
            still = min(waited, now - self._granted_at)
            if first_in_line and still + wait >= MAX_PAUSE_S:
                # The line never stands still past MAX_PAUSE_S, whatever the headers
                # said: past it, the provider's own answer decides. Only the head
                # goes then, and the next one's MAX_PAUSE_S starts: calls queued
                # together, whose own minutes ran out together, went all at once.
                wait = max(0.0, MAX_PAUSE_S - still)
            if first_in_line and wait <= recheck and now + wait <= deadline:
                if present:
                    self._remove(index)
                self.tokens.take(cost)
                self.requests.take(1.0)
                self.cubic.take(now + wait, cost)
                self._granted_at = now + wait
                first = wait > 0 and not self.waited
                if wait > 0:
                    self.waited = True
                    self._waits += 0 if present else 1
                    self._wait_s += wait
                return Pace(wait, True, first)
            if now + least > deadline or now >= deadline:
                if present:
                    self._remove(index)
                self._refused += 1
                raise self._refusal(cost, estimate, least, deadline - now)
            if not present:
                if len(self._order) >= self._policy.max_waiting:
                    self._refused += 1
                    raise QuotaWaitError(
                        f"{len(self._order)} calls already wait for the quota of key"
                        f" {self.key.fingerprint} (model {self.key.model}): the most"
                        " QuotaPolicy.max_waiting allows",
                        key=self.key.fingerprint,
                        model=self.key.model,
                        wait=None,
                        least_wait=least,
                        remaining=deadline - now,
                    )
                self._order.insert(index, ticket)
                self._costs.insert(index, cost)
            # At least a few milliseconds: a call behind one whose turn has come waits
            # for it to ask, rather than spinning.
            sleep = min(max(wait, _MIN_SLEEP_S), recheck, max(deadline - now, 0.0))
            self._asks[ticket] = now + sleep
            first = not self.waited
            self.waited = True
            self._waits += 0 if present else 1
            self._wait_s += sleep
            return Pace(sleep, False, first)

    def withdraw(self, ticket: tuple[int, int]) -> None:
        with self._lock:
            index = bisect.bisect_left(self._order, ticket)
            if index < len(self._order) and self._order[index] == ticket:
                self._remove(index)

    def refund(self, cost: float, grant: Grant | None = None) -> None:
        with self._lock:
            self.tokens.give_back(cost)
            self.requests.give_back(1.0)
            self.cubic.give_back(cost)

    def charged(self, grant: Grant | None, tokens: float, requests: float) -> None:
        """Nothing to do here: the share counts what the provider charged as ``observe``
        is told it."""

    def least_wait(self, now: float, cost: float) -> float:
        """The lower bound of a wait for ``cost`` (module doc, "Bounds")."""
        with self._lock:
            return self._least_wait(now, cost)

    # -- what the provider said ----------------------------------------------------

    def observe(
        self,
        t_send: float,
        now: float,
        readings: tuple[Reading | None, Reading | None],
        admitted: float,
    ) -> list[tuple[str, float]]:
        learned: list[tuple[str, float]] = []
        with self._lock:
            if readings == (None, None):
                if admitted > 0:  # no headers: only a 429's message reads the key
                    self.tokens.admitted(t_send, admitted)
                    self.requests.admitted(t_send, 1.0)
                return learned
            for reading, dimension, cost in (
                (readings[0], self.tokens, admitted),
                (readings[1], self.requests, 1.0 if admitted > 0 else 0.0),
            ):
                if reading is None:
                    continue
                if dimension.observe(t_send, now, reading.limit, reading.remaining, cost):
                    learned.append((reading.dimension, reading.limit))
        return learned

    def refused(
        self,
        t_send: float,
        now: float,
        refusal: Refusal,
        wait: float | None,
        had_headers: bool,
        grant: Grant | None = None,
    ) -> float:
        """A quota 429 for the request sent at ``t_send``. Its message's limit and
        level stand in for headers it lacked; the 429-learned rate drops (a 429
        always wins over headers that say there is room); and no call goes before
        ``wait`` (the least wait the answer named, else ``DEFAULT_429_WAIT_S``) times
        ``1 + retry_jitter * U(0, 1)``, never more than ``MAX_PAUSE_S``."""
        base = min(wait if wait is not None and wait > 0 else DEFAULT_429_WAIT_S, MAX_PAUSE_S)
        with self._lock:
            reading = None if had_headers else refusal.reading()
            if reading is not None:
                # No headers: the message names the limit and the level. The share
                # of the key's refill this process paces to is learned from 429s
                # (``RefusalShare``): the first starts it from what this process
                # sent before, each later one cuts it.
                dimension = self.tokens if reading.dimension == "tokens" else self.requests
                dimension.observe(t_send, now, reading.limit, reading.remaining, 0.0, refusal=True)
                before = self._tally.reading(now) if self._tally is not None else None
                own = 0.0
                if before is not None:
                    own = before.tokens if dimension is self.tokens else before.requests
                first = before.first if before is not None else None
                dimension.refused(t_send, now, reading.remaining, first, own)
            else:
                # Headers that said there was room, or a message nothing reads.
                self.cubic.throttled(now, t_send)
            self._paced_429s += 1
            pause = min(base * (1.0 + self._policy.retry_jitter * self._rng.random()), MAX_PAUSE_S)
            self._floor_until = max(self._floor_until, now + base)
            self._not_before = max(self._not_before, now + pause)
            self._hold_buckets()
            return pause

    def _hold_buckets(self) -> None:
        """The local buckets save nothing up through a pause: at its end the waiting
        calls go at the rate, not all at once (each sent together, then refused
        together, 4 at a time in simulation)."""
        for bucket in (self.tokens, self.requests, self.cubic):
            bucket.hold(self._not_before)

    def hold(self, until: float) -> None:
        """No call before ``until``: a pause another process's 429 asked for (told by
        the shared state, at most ``MAX_PAUSE_S`` away), kept here for when this
        process paces alone."""
        with self._lock:
            self._not_before = max(self._not_before, until)
            self._floor_until = max(self._floor_until, until)
            self._hold_buckets()

    def shadow(self, at: float, cost: float) -> None:
        """A send the shared state granted: counted as this process's own (its share and
        its measured send rate), without taking from the local buckets."""
        with self._lock:
            self.tokens.sent_total += cost
            self.requests.sent_total += 1.0
            self.cubic.sent(at, cost)

    # -- reading it ----------------------------------------------------------------

    def snapshot(self, now: float) -> QuotaSnapshot:
        with self._lock:
            tokens, requests = self.tokens, self.requests
            mode = "headers" if tokens.from_headers or requests.from_headers else "429s"
            if mode == "429s" and not (self.cubic.on or tokens.known or requests.known):
                mode = "off"
            return QuotaSnapshot(
                key=self.key.fingerprint,
                model=self.key.model,
                host=self.key.host,
                mode=mode,
                limit_tokens=tokens.limit,
                limit_requests=requests.limit,
                remaining_tokens=tokens.remaining if tokens.known else None,
                remaining_requests=requests.remaining if requests.known else None,
                share_tokens=tokens.current_share(now),
                share_requests=requests.current_share(now),
                rate_tokens=_rate(tokens, self.cubic, now),
                rate_requests=requests.rate(now) if requests.known else None,
                waiting=len(self._order),
                waits=self._waits,
                wait_s=self._wait_s,
                paced_429s=self._paced_429s,
                refused=self._refused,
                paused_for=max(0.0, self._not_before - now),
            )

    def view(self) -> tuple[float, float | None, float | None]:
        """This process's share of the key (the smaller of its dimensions') and what
        the key had left at the last answer, per dimension: read without the lock,
        for an attempt's span."""
        tokens, requests = self.tokens, self.requests
        share = min(
            tokens.share if tokens.known else 1.0, requests.share if requests.known else 1.0
        )
        return (
            share,
            tokens.remaining if tokens.known else None,
            requests.remaining if requests.known else None,
        )

    @property
    def active(self) -> bool:
        """Whether anything of this key is in use: a waiter, or a pause not over."""
        return bool(self._order)

    # -- inside the lock -----------------------------------------------------------

    def _least_wait(self, now: float, cost: float) -> float:
        return max(
            self._floor_until - now,
            self.tokens.least_wait(now, cost),
            self.requests.least_wait(now, 1.0),
            0.0,
        )

    def _refusal(self, cost: float, wait: float, least: float, left: float) -> QuotaWaitError:
        key = self.key
        rates = [
            f"{limit:g} {unit}/min"
            for limit, unit in ((self.tokens.limit, "tokens"), (self.requests.limit, "requests"))
            if limit is not None
        ]
        at = f" at the key's whole rate ({', '.join(rates)})" if rates else ""
        return QuotaWaitError(
            f"The quota of key {key.fingerprint} (model {key.model}) cannot take this call"
            f" ({cost:.0f} tokens) before its deadline: it would fit in about {wait:.2f} s,"
            f" at least {least:.2f} s{at}, and the call has {max(left, 0.0):.2f} s left",
            key=key.fingerprint,
            model=key.model,
            wait=wait,
            least_wait=least,
            remaining=max(left, 0.0),
        )

    def _remove(self, index: int) -> None:
        ticket = self._order.pop(index)
        self._costs.pop(index)
        self._asks.pop(ticket, None)

    def _sweep(self, now: float) -> None:
        """Drop the waiters that stopped asking (a task cancelled without a word)."""
        self._next_sweep = now + self._policy.recheck
        stale = [t for t, due in self._asks.items() if due + _SWEEP_GRACE_S < now]
        for ticket in stale:
            index = bisect.bisect_left(self._order, ticket)
            if index < len(self._order) and self._order[index] == ticket:
                self._remove(index)
            else:
                self._asks.pop(ticket, None)


def _rate(tokens: ShareController, cubic: CubicRate, now: float) -> float | None:
    rates = []
    if tokens.known:
        rates.append(tokens.rate(now))
    if cubic.on:
        rates.append(cubic.rate(now))
    return min(rates) if rates else None
