"""Adaptive concurrency per endpoint: the calls a server cannot hold wait here.

A server that sheds says "alive, but full". Sending the excess anyway wastes a
request per refusal and fails callers that had time to wait; failing them
locally protects the server by failing the caller. A concurrency limit per
endpoint does neither: calls over it wait in a local queue, within their
deadline, and go out as slots free up.

The limit is learned with AIMD on explicit drops: a shed before processing is
the only signal that lowers it (``_policies/limiter/aimd.py`` says how and why). Calls over
it wait in a queue ordered by priority, then arrival, and bounded by each
caller's deadline (``_policies/limiter/endpoint_limit.py``).

One limit per endpoint, in a bounded table: past ``max_endpoints`` (1024) the
least recently used idle entries go (never one with attempts in flight, calls
waiting or a pause running), and an endpoint that leaves the client's set (DNS
discovery) takes its entry with it once its calls are done (``forget``), so a
name whose pods move at every deploy leaves nothing behind.

This module holds ``ConcurrencyLimiter`` (its options, and one limit per
endpoint) and what an outcome tells a limit (``is_shed``, ``limit_outcome``,
``stream_cut_outcome``). The pieces live below it, and none imports this module
(each sees the limiter through a protocol of its own):

* ``_policies/limiter/endpoint_limit.py``: ``EndpointLimit``, one endpoint's limit, lock and
  queue, and ``LimitSnapshot``, a frozen copy of it (the limiter is its
  ``LimitTable``);
* ``_policies/limiter/aimd.py``: ``AimdLimit``, how the limit moves with each outcome (the
  limiter's options are its ``LimitSettings``);
* ``_policies/limiter/lease.py``: ``Lease``, a slot held by one attempt;
* ``_policies/limiter/slot_waiter.py``: ``SlotWaiter``, a call waiting for a slot from a thread
  or a task;
* ``_core/verdict.py``: ``LimitOutcome``, what an attempt tells the limit.

Hand-written: no library does concurrency limiting that is shared by threads
and asyncio tasks, ordered by priority and bounded by each caller's deadline.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable

from ..._core.clock import Clock
from ..._core.fork import fork_safe_lock
from ..._core.verdict import LimitOutcome, classify
from ..retry.budget import RetryBudget
from .endpoint_limit import EndpointLimit, LimitSnapshot

__all__ = [
    "ConcurrencyLimiter",
    "is_shed",
    "limit_outcome",
    "stream_cut_outcome",
]

DEFAULT_INITIAL_LIMIT = 20
DEFAULT_MIN_LIMIT = 1
DEFAULT_MAX_LIMIT = 1000
DEFAULT_BACKOFF_RATIO = 0.9
DEFAULT_MAX_WAITING = 4096
#: Endpoints whose limit is kept; past it the least recently used idle one goes. The
#: breakers' bound (``BreakerRegistry.max_breakers``), and 4 names of DNS discovery's
#: ``max_addresses`` (256) each.
DEFAULT_MAX_ENDPOINTS = 1024


def is_shed(error: BaseException | None) -> bool:
    """Whether an attempt was refused before the server worked on it: a 503 (the
    reference server's ``x-load-shed``, vLLM's queue-full answer, as a JSON body or
    as an error event inside a 200 stream before any content) or a 429 (the
    caller's rate, or the server's load). ``too_long`` is the caller's error, and
    a 429 out of quota (``insufficient_quota``) the caller's account's.
    ``Verdict.shed`` (``verdict.classify``)."""
    return classify(error).shed


def limit_outcome(error: BaseException | None) -> LimitOutcome:
    """What an attempt's outcome (None: it succeeded) tells the concurrency limit:
    a shed is a drop (a restart shed, a pause), anything else served or says
    nothing about load. ``Verdict.limit`` (``verdict.classify``)."""
    return classify(error).limit


def stream_cut_outcome(error: BaseException) -> LimitOutcome:
    """What a stream that failed after its first chunk tells the limit: a cut by the
    server (the connection, a 5xx event) is a loss that lowers it but never pauses
    the endpoint (``CUT``); anything else (the caller's deadline, a malformed
    chunk) says nothing. ``Verdict.limit_after_first_chunk``."""
    return classify(error).limit_after_first_chunk


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
        max_endpoints: int = DEFAULT_MAX_ENDPOINTS,
    ) -> None:
        for name, value in (
            ("initial_limit", initial_limit),
            ("min_limit", min_limit),
            ("max_limit", max_limit),
            ("max_endpoints", max_endpoints),
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
        self.max_endpoints = max_endpoints
        self.clock = clock or Clock()
        self.rng = random.Random()
        #: Requeues of shed attempts are paid from this (Finagle's requeue budget);
        #: a shed it refuses is an ordinary retry, from the retry budget (10 %), so a
        #: server that sheds everything sees at most 1.15 attempts per call.
        self.requeue_budget = requeue_budget or RetryBudget(
            ratio=0.05, min_retries_per_second=0.1, clock=self.clock
        )
        self._endpoints: dict[str, EndpointLimit] = {}
        self._lock = fork_safe_lock()
        self._seq = itertools.count()

    def endpoint(self, name: str) -> EndpointLimit:
        """The limit of endpoint ``name`` (``host:port``, or the ``Endpoint``'s name),
        made on first use. The table is bounded: past ``max_endpoints`` entries the
        idle ones (nothing in flight, waiting or paused) go, least recently used
        first; one in use is never dropped. A dropped endpoint that comes back
        starts fresh, at ``initial_limit``."""
        limit = self._endpoints.get(name)
        if limit is None:
            with self._lock:
                limit = self._endpoints.get(name)
                if limit is None:
                    limit = self._endpoints[name] = EndpointLimit(name, self)
                    if len(self._endpoints) > self.max_endpoints:
                        self._evict(keep=limit)
        return limit

    def forget(self, names: Iterable[str]) -> None:
        """These endpoints left the client's set (DNS discovery): drop their limits
        now, or, for one with attempts in flight or calls waiting, when they are
        done. (A limiter shared by clients that still call one of them: it starts
        fresh there, as an address that comes back does.)"""
        with self._lock:
            for name in names:
                limit = self._endpoints.get(name)
                if limit is not None and limit._retire(forgotten=True):
                    del self._endpoints[name]

    def _drop(self, limit: EndpointLimit) -> None:
        """A forgotten endpoint's last attempt or waiter is done: drop it now."""
        with self._lock:
            if self._endpoints.get(limit.name) is limit and limit._retire(forgotten=True):
                del self._endpoints[limit.name]

    def _evict(self, keep: EndpointLimit) -> None:
        """Under the lock: drop idle entries, least recently used first, until an
        eighth of the table is free (one sort per ``max_endpoints // 8`` new ones),
        never ``keep`` (the one just made) nor one in use."""
        target = self.max_endpoints - self.max_endpoints // 8
        for limit in sorted(self._endpoints.values(), key=lambda entry: entry.used_at):
            if len(self._endpoints) <= target:
                break
            if limit is not keep and limit._retire(forgotten=False):
                del self._endpoints[limit.name]

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
            f" max_waiting={self.max_waiting}, max_endpoints={self.max_endpoints})"
        )
