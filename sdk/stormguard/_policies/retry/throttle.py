"""Client-side adaptive throttling: refuse locally what the server would refuse anyway.

The Google SRE book ("Handling Overload", client-side throttling): over the
last ``window`` seconds a client counts the ``requests`` it made and the
``accepts`` the server gave, and refuses a new request itself with probability

    p = max(0, (requests - k * accepts) / (requests + 1))

While the server accepts everything, requests ≈ accepts and p = 0. When it
refuses most of them, the client sends about ``k`` times what it accepts: a
refusal still costs the server work (parsing, queueing, an answer), and the
refusals it no longer has to send are capacity it gets back. The requests that
still go out are the samples that show the server recovering, and p falls as
the accepts return. Requests refused here count as requests, as in the book,
so p keeps rising while nothing is accepted. Unlike the breaker, nothing is
open or closed: the load shrinks smoothly with the server's acceptance rate.

Defaults, and the reasons for them:

* ``k=2``: the book's value. The server sees at most twice what it accepts, so
  during overload at most half of what reaches it is wasted on refusals. A
  lower k throttles harder, a higher k wastes more server work on refusals.
* ``window=120`` s in 12 buckets of 10 s: the book keeps two minutes of history,
  long enough for the counts of a client that calls every few seconds to mean
  something; fixed memory whatever the call rate, as in ``RetryBudget``.

What counts (``is_accept``): the server *accepted* a request when it answered
with a result or with an error that is not a refusal: a 2xx, a caller error
(400, 401, 404, 422), a stream that delivered content. Everything the breaker
counts as a failure (no answer, timeouts, 5xx) and every shed (503) and every
429, the caller's own rate limit included, are not accepts: a quota refusal is the
book's own example of a request the client should stop sending.

One deliberate difference from the book: a request that goes out is counted
when its outcome is recorded, not when it is sent. LLM calls stay in flight
for seconds; counted at send time, a fresh client starting ten concurrent calls
would see requests = 9, accepts = 0 at the tenth and refuse most of its own
burst. Requests refused here are counted at once. A request whose outcome is
never recorded (cancelled before any answer) counts for nothing.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..._core.clock import Clock
from ..._core.fork import fork_safe_lock
from ..._core.sliding_window import SlidingWindowCounts
from ..._core.verdict import Verdict, classify

__all__ = ["AdaptiveThrottle", "ThrottleSnapshot", "is_accept"]


@dataclass(frozen=True, slots=True)
class ThrottleSnapshot:
    """A frozen copy of the counts over the current window and the refusal
    probability they give."""

    requests: int
    accepts: int
    probability: float


def is_accept(error: BaseException | None) -> bool:
    """Whether an attempt's outcome shows the server accepted it (None: it
    succeeded): ``Verdict.accepted`` (``verdict.classify``). Refused in this
    process, cancelled, a 429 or 503 refusal, or a breaker failure: not accepted."""
    return classify(error).accepted


class AdaptiveThrottle:
    """Shared by every thread and task of a client (per endpoint, when there are several).

    >>> from stormguard.testing import FakeClock
    >>> throttle = AdaptiveThrottle(clock=FakeClock(), rng=random.Random(0))
    >>> for _ in range(75): throttle.record_reject()
    >>> for _ in range(25): throttle.record_accept()
    >>> round(throttle.probability(), 3)  # (100 - 2 * 25) / 101
    0.495
    """

    def __init__(
        self,
        k: float = 2.0,
        window: float = 120.0,
        *,
        buckets: int = 12,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not (math.isfinite(k) and k >= 1.0):
            # Below 1 a server that accepts everything would still see refusals.
            raise ValueError(f"k must be a finite number >= 1, got {k!r}")
        self.k = k
        self.window = window
        self._clock = clock or Clock()
        self._rng = rng or random.Random()
        # (requests, accepts) over the window.
        self._counts = SlidingWindowCounts(window=window, buckets=buckets, clock=self._clock)
        self._lock = fork_safe_lock()

    def _probability(self, requests: int, accepts: int) -> float:
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def should_reject(self) -> bool:
        """Draw whether to refuse the next request locally; a refusal counts as a request."""
        with self._lock:
            probability = self._probability(*self._counts.totals())
            if probability <= 0.0 or self._rng.random() >= probability:
                return False
            self._counts.add(a=1)
            return True

    def record_accept(self) -> None:
        """One request went out and the server accepted it."""
        with self._lock:
            self._counts.add(a=1, b=1)

    def record_reject(self) -> None:
        """One request went out and the server refused it or never answered."""
        with self._lock:
            self._counts.add(a=1)

    def record(self, error: BaseException | None, *, verdict: Verdict | None = None) -> None:
        """Record an attempt's outcome by its ``Verdict`` (``verdict``, else classified
        here): an accept, a reject, or nothing for what was never sent (refused in
        this process, cancelled)."""
        verdict = verdict or classify(error)
        if verdict.accepted:
            self.record_accept()
        elif verdict.sent:
            self.record_reject()

    def probability(self) -> float:
        """The refusal probability the next request would be drawn against."""
        with self._lock:
            return self._probability(*self._counts.totals())

    def state(self) -> ThrottleSnapshot:
        """Requests, accepts and the refusal probability over the current window."""
        with self._lock:
            requests, accepts = self._counts.totals()
            return ThrottleSnapshot(requests, accepts, self._probability(requests, accepts))

    def __repr__(self) -> str:
        return f"AdaptiveThrottle(k={self.k}, window={self.window})"
