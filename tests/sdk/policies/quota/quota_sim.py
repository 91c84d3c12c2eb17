"""A simulated key on virtual time: P processes x W workers, each process pacing
with its own real ``KeyQuota``, against one OpenAI-style quota.

The key is two buckets (tokens, requests) that refill continuously at limit / 60
a second and charge a request its cost when they admit it, as OpenAI's do and the
reference server's (``--quota-tpm``) do. Each answer carries the
``x-ratelimit-*`` readings (unless ``headers=False``); a refusal is a 429 with
OpenAI's message ("Limit L, Used U, Requested C. Please try again in ...") and the
Retry-After of ``retry_after`` ("seconds", rounded up; "ms"; "none").

Deterministic (one seeded random, a heap of events, no threads, no sleeping): a
test of convergence that runs in milliseconds. ``python -m tests.sdk.policies.quota.quota_sim``
prints the table docs/quotas.md quotes.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from stormguard import QuotaWaitError
from stormguard._policies.quota import KeyQuota, QuotaKey, QuotaPolicy
from stormguard._policies.quota._signals import Reading, Refusal
from stormguard._policies.quota._tally import SendTally

__all__ = ["Outcome", "SimKey", "run"]

KEY = QuotaKey("k", "h", "m")


@dataclass
class SimKey:
    """One key's quota, as the provider keeps it."""

    tpm: float
    rpm: float
    tokens: float = 0.0
    requests: float = 0.0
    updated: float = 0.0
    admitted: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        self.tokens, self.requests = self.tpm, self.rpm

    def _refill(self, now: float) -> None:
        elapsed, self.updated = now - self.updated, now
        self.tokens = min(self.tpm, self.tokens + elapsed * self.tpm / 60)
        self.requests = min(self.rpm, self.requests + elapsed * self.rpm / 60)

    def admit(self, now: float, cost: float) -> bool:
        self._refill(now)
        if self.tokens >= cost and self.requests >= 1:
            self.tokens -= cost
            self.requests -= 1
            self.admitted += 1
            return True
        self.refused += 1
        return False

    def readings(self) -> tuple[Reading, Reading]:
        return (
            Reading("tokens", self.tpm, float(int(self.tokens))),
            Reading("requests", self.rpm, float(int(self.requests))),
        )

    def refusal(self, cost: float) -> tuple[Refusal, float]:
        """The 429's message, and the exact wait until the request fits."""
        need_tokens = max(0.0, cost - self.tokens) / (self.tpm / 60)
        need_requests = max(0.0, 1 - self.requests) / (self.rpm / 60)
        if need_tokens >= need_requests:
            used, limit, dimension = self.tpm - self.tokens, self.tpm, "tokens"
        else:
            used, limit, dimension = self.rpm - self.requests, self.rpm, "requests"
        wait = max(need_tokens, need_requests)
        message = Refusal(dimension, int(limit), int(used), int(cost), wait)  # type: ignore[arg-type]
        return message, wait


@dataclass
class Outcome:
    ok: int = 0
    failed: int = 0
    last: float = 0.0
    requests: int = 0
    refused: int = 0
    ideal: float = 0.0
    calls: int = 0
    waits: list[float] = field(default_factory=list)

    @property
    def requests_per_call(self) -> float:
        return self.requests / self.calls

    @property
    def x_ideal(self) -> float:
        return self.last / self.ideal if self.ideal else math.nan


def run(
    *,
    processes: int,
    workers: int = 8,
    calls: int = 300,
    cost: float = 315,
    tpm: float = 60_000,
    rpm: float = 10_000,
    latency: float = 0.5,
    headers: bool = True,
    retry_after: str = "seconds",
    deadline: float = 120.0,
    seed: int = 1,
    policy: QuotaPolicy | None = None,
    stagger: float = 0.2,
    delay: float = 0.0,
    read_at: str = "admission",
    on_response: Callable[[int, float], None] | None = None,
    spread: float = 0.0,
) -> Outcome:
    """``calls`` calls of ``cost`` tokens spread over ``processes`` x ``workers``.

    ``delay``: the provider admits a request up to this many seconds after the client
    stamped it sent (a loaded host). ``read_at``: when an answer's ``x-ratelimit-*``
    values are read, ``"admission"`` (the level the request left) or ``"response"``
    (the level when the answer is written, as the reference server does).
    ``spread``: each process starts up to this many seconds after the first (workers
    a pool started one by one), its threads within ``stagger`` of that."""
    rng = random.Random(seed)
    policy = policy or QuotaPolicy()
    key = SimKey(tpm, rpm)
    # As in a client, a process's ``KeyQuota`` is made by the key's first quota signal
    # (an answer with headers, a 429); until then its calls go unpaced.
    made: list[KeyQuota | None] = [None] * processes
    # What each process's answers cost before its pacing turned on (the registry's).
    tallies = [SendTally() for _ in range(processes)]

    def quota(p: int) -> KeyQuota:
        state = made[p]
        if state is None:
            rng_p = random.Random(seed * 1000 + p)
            state = made[p] = KeyQuota(KEY, policy, rng_p, tallies[p])
        return state

    events: list[tuple[float, int, Callable[[], None]]] = []
    seq = iter(range(10**9))
    clock = [0.0]
    left = [calls // processes + (1 if i < calls % processes else 0) for i in range(processes)]
    out = Outcome(calls=calls)

    def at(t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(events, (t, next(seq), fn))

    def worker(p: int) -> None:
        if left[p] == 0:
            return
        left[p] -= 1
        attempt(p, clock[0], (1, next(seq)), 0.0)

    def attempt(p: int, start: float, ticket: tuple[int, int], waited: float) -> None:
        now = clock[0]
        state = made[p]
        if state is None:
            send(p, start, ticket, waited)
            return
        try:
            pace = state.reserve(ticket, cost, now, start + deadline, waited)
        except QuotaWaitError:
            out.failed += 1
            at(now, lambda: worker(p))
            return
        if not pace.granted:
            at(now + pace.seconds, lambda: attempt(p, start, ticket, waited + pace.seconds))
            return
        at(now + pace.seconds, lambda: send(p, start, ticket, 0.0))

    def send(p: int, start: float, ticket: tuple[int, int], waited: float) -> None:
        # The client stamps its send now; the provider admits it up to ``delay`` later
        # (a loaded host, the network), so its order there is not the stamps' order.
        t_send = clock[0]
        if delay > 0:
            at(t_send + rng.uniform(0, delay), lambda: admit(p, start, ticket, waited, t_send))
        else:
            admit(p, start, ticket, waited, t_send)

    def admit(p: int, start: float, ticket: tuple[int, int], waited: float, t_send: float) -> None:
        out.requests += 1
        if key.admit(clock[0], cost):
            found = key.readings() if headers else (None, None)

            def answered() -> None:
                seen = found
                if headers and read_at == "response":
                    key._refill(clock[0])
                    seen = key.readings()
                if headers or made[p] is not None:
                    quota(p).observe(t_send, clock[0], seen, cost)
                else:
                    tallies[p].add(t_send, cost)
                out.ok += 1
                out.last = clock[0]
                out.waits.append(waited)
                if on_response is not None:
                    on_response(p, clock[0])
                worker(p)

            at(clock[0] + latency, answered)
            return
        found = key.readings() if headers else (None, None)
        refusal, exact = key.refusal(cost)
        wait: float | None = None
        if retry_after == "seconds":
            wait = float(math.ceil(exact))
        elif retry_after == "ms":
            wait = math.ceil(exact * 1000) / 1000

        def refused() -> None:
            if headers:
                quota(p).observe(t_send, clock[0], found, 0.0)
            quota(p).refused(t_send, clock[0], refusal, wait or refusal.retry_in, headers)
            attempt(p, start, ticket, waited)

        at(clock[0] + 0.02, refused)

    for p in range(processes):
        start = rng.uniform(0, spread) if spread > 0 else 0.0
        for _ in range(workers):
            at(start + rng.uniform(0, stagger), lambda p=p: worker(p))
    while events:
        t, _, fn = heapq.heappop(events)
        clock[0] = t
        fn()
    out.refused = key.refused
    out.ideal = max((calls * cost - tpm) / (tpm / 60), (calls - rpm) / (rpm / 60), 0.0)
    return out


def _table() -> None:
    bounds = {
        "tpm": {"tpm": 60_000, "rpm": 10_000},
        "rpm": {"tpm": 10**7, "rpm": 200},
        "both": {"tpm": 60_000, "rpm": 200},
    }
    for headers in (True, False):
        for processes in (1, 4, 16):
            for bound, limits in bounds.items():
                for mode in ("seconds", "ms", "none"):
                    o = run(processes=processes, headers=headers, retry_after=mode, **limits)  # type: ignore[arg-type]
                    print(
                        f"headers={headers!s:5} P={processes:2} {bound:4} {mode:7}"
                        f" ok={o.ok / o.calls:.3f} rpc={o.requests_per_call:.3f}"
                        f" 429s={o.refused:3} x_ideal={o.x_ideal:.3f}"
                    )


if __name__ == "__main__":
    _table()
