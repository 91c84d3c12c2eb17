"""Processes sharing one key's bucket in Redis, on virtual time: P processes x W
workers, each process with its own real ``QuotaGate`` (its own registry and
``SharedKeyQuota``), every reservation a real run of the bucket script on fakeredis,
against one provider's token bucket that answers without ``x-ratelimit-*`` headers
(the reference server's ``--no-quota-headers``: 429s only, OpenAI's message, a
whole-second Retry-After).

The caller passes the ``FakeClock`` that fakeredis's ``TIME`` reads, and has pointed
``RedisStore`` at one fakeredis server (tests/sdk/policies/quota/test_quota_redis.py's fixtures).
Deterministic for a seed (a heap of events, no threads, no sleeping).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from stormguard._core.exceptions import QuotaWaitError
from stormguard._core.rate_limit_headers import NO_RATE_LIMIT
from stormguard._policies.quota import QuotaGate, SharedAsk
from stormguard._policies.quota._bucket import Reply
from stormguard.testing import FakeClock

__all__ = ["Provider", "SharedRun", "run_shared"]

URL = "redis://127.0.0.1:6390/0"


@dataclass
class Provider:
    """One key's token bucket as the provider keeps it: full at first, refilled at
    ``tpm`` / 60 a second, a request charged its ``charge`` when admitted."""

    tpm: float
    level: float = math.nan
    at: float = 0.0
    admitted: int = 0
    refused: int = 0
    #: When each refusal happened.
    refusals: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.level = self.tpm

    def admit(self, now: float, charge: float) -> str | None:
        """None when admitted, else the 429's message (OpenAI's words)."""
        rate = self.tpm / 60
        self.level = min(self.tpm, self.level + (now - self.at) * rate)
        self.at = now
        if self.level >= charge:
            self.level -= charge
            self.admitted += 1
            return None
        self.refused += 1
        self.refusals.append(now)
        wait = (charge - self.level) / rate
        used = int(self.tpm) - math.floor(self.level)
        return (
            f"Rate limit reached for m in organization org-k on tokens per min (TPM): Limit"
            f" {int(self.tpm)}, Used {used}, Requested {int(charge)}. Please try again in"
            f" {math.ceil(wait * 1000)}ms."
        )


@dataclass
class SharedRun:
    """What a run did."""

    provider: Provider
    calls: int
    ok: int = 0
    #: Calls that failed with ``QuotaWaitError`` (their turn came after their deadline).
    failed: int = 0
    #: When the last call ended.
    last: float = 0.0
    #: Attempts on their way (sent, not answered) when a reply first knew the limit.
    in_flight_when_learned: int | None = None
    #: Refusals of attempts granted by a bucket that knew the limit.
    refused_after_learning: int = 0

    charge: float = 0.0

    @property
    def ideal(self) -> float:
        """The least time the key allows: a full bucket at once, then its refill."""
        tpm = self.provider.tpm
        return max(0.0, (self.calls * self.charge - tpm) / (tpm / 60))


def run_shared(
    clock: FakeClock,
    *,
    processes: int = 3,
    workers: int = 4,
    calls: int = 66,
    tpm: float = 12_000,
    charge: float = 215,
    estimate: float = 226,
    output: float = 200,
    latency: float = 0.1,
    jitter: float = 0.02,
    seed: int = 1,
    deadline: float = 90.0,
    usage: bool = True,
) -> SharedRun:
    """``calls`` chat calls over ``processes`` x ``workers``; each is charged ``charge``
    by the provider and estimated at ``estimate`` (of which ``output`` is its
    max_tokens) by the client. A request reaches the provider after up to ``jitter``
    seconds, and its answer comes ``latency`` after that (a 429's at once); with
    ``usage`` the answer says what the provider charged (``CallQuota.charged``)."""
    from stormguard._policies.quota import QuotaKey, QuotaPolicy

    rng = random.Random(seed)
    key = QuotaKey("k", "h", "m")
    provider = Provider(tpm)
    out = SharedRun(provider, calls, charge=charge)
    gates = [
        QuotaGate(QuotaPolicy(redis_url=URL, max_keys=1024 - p), clock) for p in range(processes)
    ]
    for gate in gates:
        gate.registry.activate(key)
    events: list[tuple[float, int, Callable[[], None]]] = []
    seq = itertools.count()
    left = [calls // processes + (1 if p < calls % processes else 0) for p in range(processes)]
    on_way = [0]

    def at(t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(events, (t, next(seq), fn))

    def worker(p: int) -> None:
        if left[p] == 0:
            return
        left[p] -= 1
        quota = gates[p].call(key, 1)
        attempt(p, quota, clock.now() + deadline)

    def attempt(p: int, quota: object, until: float) -> None:
        from stormguard._policies.quota import CallQuota

        assert isinstance(quota, CallQuota)
        now = clock.now()
        known = False
        try:
            pace = quota.pace(estimate, now, until)
            while isinstance(pace, SharedAsk):
                reply = pace.ask_sync()
                if isinstance(reply, Reply) and reply.known:
                    known = True
                    if out.in_flight_when_learned is None:
                        out.in_flight_when_learned = on_way[0]
                pace = quota.answered(pace, reply, now)
        except QuotaWaitError:
            out.failed += 1
            worker(p)
            return
        if pace is None or pace.granted:
            wait = 0.0 if pace is None else pace.seconds
            at(now + wait, lambda: send(p, quota, until, known))
        else:
            at(now + pace.seconds, lambda: attempt(p, quota, until))

    def send(p: int, quota: object, until: float, known: bool) -> None:
        from stormguard._policies.quota import CallQuota

        assert isinstance(quota, CallQuota)
        quota.sent()
        t_send = clock.now()
        on_way[0] += 1

        def arrive() -> None:
            message = provider.admit(clock.now(), charge)
            if message is None:
                at(clock.now() + latency, done)
                return
            if known:
                out.refused_after_learning += 1
            at(clock.now() + 0.002, lambda: refused(message))

        def done() -> None:
            if usage:
                quota.charged(charge)
            on_way[0] -= 1
            out.ok += 1
            out.last = clock.now()
            worker(p)

        def refused(message: str) -> None:
            on_way[0] -= 1
            wait = float(math.ceil(float(message.rsplit("in ", 1)[1][:-3]) / 1000))
            quota.refused(t_send, clock.now(), message, wait, NO_RATE_LIMIT)
            attempt(p, quota, until)

        at(t_send + rng.uniform(0.0, jitter), arrive)

    for p in range(processes):
        for _ in range(workers):
            at(rng.uniform(0.0, 0.05), lambda p=p: worker(p))
    while events:
        t, _, fn = heapq.heappop(events)
        clock.advance(max(0.0, t - clock.now()))
        fn()
    return out
