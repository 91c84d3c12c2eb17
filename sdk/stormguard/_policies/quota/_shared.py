"""``SharedKeyQuota``: one key's quota shared by every process on it, through Redis or
this machine's quota files (a ``QuotaStore``: ``_redis.py``, ``_host_store.py``), with
this process's own pacing (``KeyQuota``) kept warm beside it for when the store fails.
Below, "Redis" stands for either: the files run the script's step in Python.

A reservation is I/O, which a policy never does: ``reserve`` returns a ``SharedAsk``,
an action the call flow yields and its driver performs (redis-py's sync client, or
``redis.asyncio``; a file under ``flock``), bounded by the store's timeout; a call
with less time left than that paces locally. ``answered`` turns the reply into the ``Pace`` a call
sleeps, or a ``QuotaWaitError`` when its turn comes after its deadline.

What a process learns between two of its reservations (a limit from the headers or a
429's message, the provider's ``remaining``, a cost to give back, a 429's pause) waits
in an outbox and rides on its next reservation: one round trip per attempt, never a
blocking call outside the flow. Every signal also goes to the local ``KeyQuota``, so
that the fall back to it (Redis down, slow or answering garbage; ``_redis.py``) paces
on what the process has seen.

**The provider's ``remaining`` is folded in** against Redis's clock: an answer
received at t (this process's clock, moved to Redis's by the offset the last reply
showed, taken at its latest) that says R was left caps the bucket at
R + rho * (now - t): what was left, refilled since. It only lowers the bucket, never
raises it: R counts neither the calls still on their way nor those waiting for their
turn, which the bucket has already taken, so a bucket raised to it would hand their
room out twice. (Nor does the cap subtract what other calls took after t: under
concurrency the provider may have admitted them first, and subtracting them sank the
bucket by a whole burst.) Pending answers fold into one number per dimension (their
least R - rho * t).

**Giving back.** A reservation goes back when the provider did not charge it: the
attempt was never sent (cancelled, refused before sending), or the provider answered
without charging it (a 4xx other than a 429; a shed is charged: the quota comes
before admission). Only what the bucket took goes back: a reservation made before any
process knew the limit took nothing from it, and giving its cost back (each call of
a burst's first wave that met a 429) would fill the bucket with room the provider
never had. A quota 429 gives back what the provider had left for the call (its
message's Limit - Used, at most the call's cost), not the whole reservation: the
bucket granted the call because it counted at least the cost there, so it counted
too much by the cost less what was there, and the refusal is the one place that
error shows (in a queue of calls taken ahead, R + the refill is above the bucket and
caps nothing). Given back whole, the error would stay, and the next turn would meet
a 429 again. A 429 that does not say what was left gives nothing back on the limit
it names (nor on either, naming none).

**Truing up.** An answer that says what the provider counted (``usage.prompt_tokens``)
says what it charged: that count and the output the cost counts (``max_tokens``).
The bucket took the estimate; the difference goes back (or is taken) at the process's
next reservation, as Envoy AI Gateway and LiteLLM's router charge their counters the usage
an answer reports. Unlike the provider's ``remaining`` this is exact: it is this
call's own charge, whatever is on its way. An answer that used fewer tokens than
``max_tokens`` gives nothing back: OpenAI charges prompt + ``max_tokens`` at admission
and refunds nothing, so neither does the bucket (docs/quotas.md).

**Before a limit is known** (no process on the key has had a signal) the script has
nothing to pace and takes nothing; the process paces itself as without Redis. Every
attempt asks Redis, known limit or not: a burst that starts on many hosts at once is
paced from the moment any one of them learns the limit (a 429's message, the
headers), which is the case a local estimate cannot meet; the price is one round trip
per attempt (docs/quotas.md has the figure).
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..._core.exceptions import QuotaWaitError
from ..._core.fork import fork_safe_lock
from ..limiter.aimd import MAX_PAUSE_S
from ._bucket import TTL_S, bucket_name
from ._config import QuotaPolicy
from ._key import Grant, KeyQuota, Pace, QuotaKey, QuotaSnapshot
from ._signals import Reading, Refusal

if TYPE_CHECKING:
    from ._bucket import Reply
    from ._store import QuotaStore
    from ._tally import SendTally

__all__ = ["SharedAsk", "SharedKeyQuota", "shared_name"]


@functools.lru_cache(maxsize=4096)
def shared_name(key: QuotaKey) -> str:
    """The name of ``key``'s shared bucket (``_bucket.bucket_name``), worked out once."""
    return bucket_name(key)


@dataclass(slots=True)
class _Outbox:
    """What one dimension tells Redis at the next reservation."""

    #: The limit this process knows (re-made in Redis if the hash is gone), and whether
    #: it was learned since the last reservation (then it replaces the shared one).
    limit: float | None = None
    new: bool = False
    #: The least R - rho * t of the answers not folded in yet (t on Redis's clock).
    anchor: float | None = None
    #: What goes back to the bucket (negative: what it takes besides its reservations).
    refund: float = 0.0

    def args(self) -> tuple[object, ...]:
        anchor = "" if self.anchor is None else repr(self.anchor)
        return (repr(self.limit or 0.0), "1" if self.new else "0", anchor, repr(self.refund))

    def fold(self, reading: Reading, t: float) -> None:
        anchor = reading.remaining - reading.limit / 60.0 * t
        if math.isfinite(anchor):
            self.anchor = anchor if self.anchor is None else min(self.anchor, anchor)

    def learn(self, limit: float) -> None:
        if limit != self.limit:
            self.limit, self.new = limit, True


class SharedAsk:
    """The I/O of one reservation (a call-flow action): run the key's script on Redis.
    The driver sends back what ``ask_sync``/``ask_async`` return (a ``Reply``, or the
    error, never raised)."""

    __slots__ = (
        "args",
        "asked",
        "cost",
        "deadline",
        "grant",
        "outbox",
        "state",
        "ticket",
        "waited",
    )

    def __init__(
        self,
        state: SharedKeyQuota,
        args: tuple[object, ...],
        ticket: tuple[int, int],
        cost: float,
        deadline: float,
        waited: float,
        outbox: tuple[_Outbox, _Outbox, float],
        asked: float,
    ) -> None:
        self.state = state
        self.args = args
        self.ticket = ticket
        self.cost = cost
        self.deadline = deadline
        self.waited = waited
        self.outbox = outbox
        #: This process's clock when it asked (Redis ran the script after it).
        self.asked = asked
        #: What the reservation took, once answered and granted.
        self.grant: Grant | None = None

    def ask_sync(self) -> Reply | BaseException:
        return self.state.store.run_sync(self.state.name, self.args)

    async def ask_async(self) -> Reply | BaseException:
        return await self.state.store.run_async(self.state.name, self.args)


class SharedKeyQuota:
    """One key's quota in Redis, and this process's own beside it (module doc)."""

    def __init__(
        self,
        key: QuotaKey,
        policy: QuotaPolicy,
        store: QuotaStore,
        rng: random.Random | None = None,
        tally: SendTally | None = None,
    ) -> None:
        self.key = key
        self.local = KeyQuota(key, policy, rng, tally)
        self.store = store
        self.name = shared_name(key)
        self._policy = policy
        self._lock = fork_safe_lock()
        self._tokens = _Outbox()
        self._requests = _Outbox()
        #: A 429's pause (this process's clock) not told to Redis yet.
        self._pause_until = -math.inf
        #: Redis's last reply, and Redis's clock less this process's, at its most: the
        #: script ran after the ask was sent, so Redis's time less the ask's is the
        #: largest offset the reply allows, and an answer's time moved by it is at its
        #: latest (the refill since it, at its least: a cap never too high).
        self.reply: Reply | None = None
        self._offset: float | None = store.offset
        self._waits = 0
        self._wait_s = 0.0
        self._refused = 0

    @property
    def waited(self) -> bool:
        return self.local.waited

    # -- the call's side -----------------------------------------------------------

    def reserve(
        self,
        ticket: tuple[int, int],
        cost: float,
        now: float,
        deadline: float,
        waited: float = 0.0,
    ) -> Pace | SharedAsk:
        """Ask Redis (a ``SharedAsk`` for the driver), or pace locally: Redis is down,
        or the call has less time left than a Redis call may take."""
        store = self.store
        if deadline - now >= store.timeout and store.usable(now):
            with self._lock:
                outbox = (self._tokens, self._requests, self._pause_until)
                pause = max(0.0, min(self._pause_until - now, MAX_PAUSE_S))
                args = (
                    repr(cost),
                    repr(max(deadline - now, 0.0)),
                    repr(MAX_PAUSE_S),
                    repr(max(MAX_PAUSE_S - waited, 0.0)),
                    _ttl(),
                    repr(pause),
                    *self._tokens.args(),
                    *self._requests.args(),
                )
                self._tokens = _Outbox(self._tokens.limit)
                self._requests = _Outbox(self._requests.limit)
                self._pause_until = -math.inf
            return SharedAsk(self, args, ticket, cost, deadline, waited, outbox, now)
        return self.local.reserve(ticket, cost, now, deadline, waited)

    def answered(self, ask: SharedAsk, reply: Reply | BaseException, now: float) -> Pace:
        """Redis's reply to ``ask`` (or the error that stood for it): the call's
        ``Pace`` (granted: ``ask.grant`` says what it took), or ``QuotaWaitError``."""
        if isinstance(reply, BaseException):
            self.store.failed(now, reply)
            self._put_back(ask.outbox)
            return self.local.reserve(ask.ticket, ask.cost, now, ask.deadline, ask.waited)
        self.store.answered()
        self.reply, self._offset = reply, reply.now - ask.asked
        if reply.paused_for > 0:
            self.local.hold(now + reply.paused_for)
        if not reply.known:
            return self._unpaced(ask, reply, now)
        if not reply.granted:
            self._refused += 1
            raise self._refusal(ask.cost, reply.wait, max(ask.deadline - now, 0.0))
        took = (reply.limit_tokens is not None, reply.limit_requests is not None)
        ask.grant = Grant(ask.cost, False, *took)
        self.local.shadow(now + reply.wait, ask.cost)
        first = False
        if reply.wait > 0:
            first = not self.local.waited
            self.local.waited = True
            self._waits += 1
            self._wait_s += reply.wait
        return Pace(reply.wait, True, first)

    def _unpaced(self, ask: SharedAsk, reply: Reply, now: float) -> Pace:
        """No process on the key has learned a limit: this process paces itself (its
        429-learned rate, any pause). The shared bucket took nothing, so nothing goes
        back to it."""
        pace = self.local.reserve(ask.ticket, ask.cost, now, ask.deadline, ask.waited)
        if pace.granted:
            ask.grant = Grant(ask.cost, True)
        return pace

    def withdraw(self, ticket: tuple[int, int]) -> None:
        self.local.withdraw(ticket)

    def refund(self, cost: float, grant: Grant | None = None) -> None:
        """A granted attempt that was never sent: its cost goes back where it was taken."""
        if grant is None or grant.local:
            self.local.refund(cost)
        if grant is not None:
            self._give_back(grant, grant.cost, 1.0)

    def charged(self, grant: Grant | None, tokens: float, requests: float) -> None:
        """What the provider charged an attempt it answered (module doc, "Truing
        up"): the shared bucket gives back, or takes, the difference from ``grant``."""
        if grant is not None:
            self._give_back(grant, grant.cost - tokens, 1.0 - requests)

    def least_wait(self, now: float, cost: float) -> float:
        return self.local.least_wait(now, cost)

    # -- what the provider said ----------------------------------------------------

    def observe(
        self,
        t_send: float,
        now: float,
        readings: tuple[Reading | None, Reading | None],
        admitted: float,
    ) -> list[tuple[str, float]]:
        learned = self.local.observe(t_send, now, readings, admitted)
        with self._lock:
            for reading, outbox in zip(readings, (self._tokens, self._requests), strict=True):
                if reading is None:
                    continue
                outbox.learn(reading.limit)
                self._fold(outbox, reading, now)
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
        """A quota 429: this process's pause (and the local pacing's lesson), told to
        every process through Redis at the next reservation, with the limit and level
        its message names when no headers came; and what the provider had left for
        the call given back (module doc, "Giving back")."""
        pause = self.local.refused(t_send, now, refusal, wait, had_headers)
        reading = refusal.reading()
        with self._lock:
            self._pause_until = max(self._pause_until, now + pause)
            if reading is not None and not had_headers:
                outbox = self._tokens if reading.dimension == "tokens" else self._requests
                outbox.learn(reading.limit)
                self._fold(outbox, reading, now)
        if grant is not None:
            self._give_back(grant, *_left_for(grant, refusal, reading))
        return pause

    # -- reading it ----------------------------------------------------------------

    def snapshot(self, now: float) -> QuotaSnapshot:
        mine = self.local.snapshot(now)
        reply = self.reply
        backend = "local-fallback" if self.store.down else self.store.backend
        limit_tokens, limit_requests = mine.limit_tokens, mine.limit_requests
        if reply is not None:
            limit_tokens = reply.limit_tokens or limit_tokens
            limit_requests = reply.limit_requests or limit_requests
        return _replace(
            mine,
            backend=backend,
            limit_tokens=limit_tokens,
            limit_requests=limit_requests,
            waits=mine.waits + self._waits,
            wait_s=mine.wait_s + self._wait_s,
            refused=mine.refused + self._refused,
        )

    def view(self) -> tuple[float, float | None, float | None]:
        return self.local.view()

    @property
    def active(self) -> bool:
        return self.local.active

    # -- inside -------------------------------------------------------------------

    def _fold(self, outbox: _Outbox, reading: Reading, at: float) -> None:
        """The reading of an answer received at ``at`` (this process's clock)."""
        if self._offset is not None:  # no reply yet: the store's clock is not known here
            outbox.fold(reading, at + self._offset)

    def _give_back(self, grant: Grant, tokens: float, requests: float) -> None:
        """Give ``tokens`` and ``requests`` of ``grant`` back to the shared bucket (take
        them, negative), once, in the dimensions it took from."""
        with self._lock:
            if grant.returned:
                return
            grant.returned = True
            if grant.tokens:
                self._tokens.refund += tokens
            if grant.requests:
                self._requests.refund += requests

    def _put_back(self, outbox: tuple[_Outbox, _Outbox, float]) -> None:
        """A reservation that failed: what it was to tell is told at the next one, but
        what was to go back or be taken: the script may have run (a reply that came
        too late), and told twice it would count twice."""
        tokens, requests, pause = outbox
        with self._lock:
            for old, current in ((tokens, self._tokens), (requests, self._requests)):
                if old.new and current.limit == old.limit:
                    current.new = True
                if old.anchor is not None:
                    anchor = current.anchor
                    current.anchor = old.anchor if anchor is None else min(anchor, old.anchor)
            self._pause_until = max(self._pause_until, pause)

    def _refusal(self, cost: float, wait: float, left: float) -> QuotaWaitError:
        key, reply = self.key, self.reply
        rates = []
        if reply is not None:
            for limit, unit in ((reply.limit_tokens, "tokens"), (reply.limit_requests, "requests")):
                if limit is not None:
                    rates.append(f"{limit:g} {unit}/min")
        return QuotaWaitError(
            f"The quota of key {key.fingerprint} (model {key.model}) cannot take this call"
            f" ({cost:.0f} tokens) before its deadline: its turn in the key's shared bucket"
            f" ({', '.join(rates)}; {self.store.backend}) comes in {wait:.2f} s, and the call has"
            f" {left:.2f} s left",
            key=key.fingerprint,
            model=key.model,
            wait=wait,
            least_wait=wait,
            remaining=left,
        )


def _left_for(grant: Grant, refusal: Refusal, reading: Reading | None) -> tuple[float, float]:
    """What a quota 429 gives back of ``grant`` (tokens, requests): on the limit it
    names, what its message says was left (at most the grant), nothing when it does
    not say; on the other, all of it; nothing on either when it names no limit."""
    if refusal.dimension is None:
        return 0.0, 0.0
    left = 0.0 if reading is None else max(0.0, reading.remaining)
    if refusal.dimension == "tokens":
        return min(left, grant.cost), 1.0
    return grant.cost, min(left, 1.0)


def _ttl() -> str:
    return str(TTL_S)


def _replace(snapshot: QuotaSnapshot, **changes: object) -> QuotaSnapshot:
    import dataclasses

    return dataclasses.replace(snapshot, **changes)  # type: ignore[arg-type]
