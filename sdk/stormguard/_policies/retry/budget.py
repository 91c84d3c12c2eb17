"""A retry budget: retries are allowed only as a fraction of recent calls.

This is Finagle's RetryBudget (and gRPC's retry throttling, and the AWS SDK's
retry quota) in its simplest useful form: over a sliding window of
``window`` seconds, retries may not exceed ``ratio`` times the logical calls
made in that window, plus a floor of ``min_retries_per_second * window`` so a
client that calls rarely can still ride out one transient fault.

Why a budget and not only ``max_attempts``: with 3 attempts per call, a full
outage turns every call into 3 requests — the server that is down sees 3x its
load exactly when it can least take it. With a 10% budget it sees at most
1.1x plus the floor, whatever the outage does. The SRE book ("Handling
Overload") uses the same 10% per-client ratio.

Hand-written because tenacity has no shared, time-windowed state across calls
(its strategies see one call at a time); the budget plugs into tenacity as a
stop condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..._core.clock import Clock
from ..._core.fork import fork_safe_lock
from ..._core.sliding_window import SlidingWindowCounts

__all__ = ["BudgetSnapshot", "RetryBudget"]


@dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    """A frozen copy of the budget over the current window."""

    calls: int
    retries: int
    refused: int
    available: float


class RetryBudget:
    """Shared by every thread and task of a client; pass the same object to several
    clients to give them one budget.

    >>> from stormguard.testing import FakeClock
    >>> budget = RetryBudget(ratio=0.1, min_retries_per_second=0, clock=FakeClock())
    >>> for _ in range(20): budget.record_call()
    >>> budget.try_spend(), budget.try_spend(), budget.try_spend()
    (True, True, False)
    """

    def __init__(
        self,
        *,
        ratio: float = 0.1,
        window: float = 10.0,
        min_retries_per_second: float = 0.1,
        buckets: int = 10,
        clock: Clock | None = None,
    ) -> None:
        if not (math.isfinite(ratio) and ratio >= 0):
            raise ValueError(f"ratio must be a finite number >= 0, got {ratio!r}")
        if not (math.isfinite(min_retries_per_second) and min_retries_per_second >= 0):
            raise ValueError("min_retries_per_second must be a finite number >= 0")
        self.ratio = ratio
        self.window = window
        self.min_retries_per_second = min_retries_per_second
        self._clock = clock or Clock()
        self._counts = SlidingWindowCounts(window=window, buckets=buckets, clock=self._clock)
        self._refused = 0
        self._lock = fork_safe_lock()

    def _available(self, calls: int, retries: int) -> float:
        return self.ratio * calls + self.min_retries_per_second * self.window - retries

    def record_call(self) -> None:
        """Count one logical call (each deposit lets ``ratio`` of a retry happen)."""
        with self._lock:
            self._counts.add(a=1)

    def try_spend(self) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is empty."""
        with self._lock:
            calls, retries = self._counts.totals()
            if self._available(calls, retries) < 1.0:
                self._refused += 1
                return False
            self._counts.add(b=1)
            return True

    def state(self) -> BudgetSnapshot:
        """Calls, retries and what is left over the current window."""
        with self._lock:
            calls, retries = self._counts.totals()
            return BudgetSnapshot(
                calls=calls,
                retries=retries,
                refused=self._refused,
                available=max(self._available(calls, retries), 0.0),
            )

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio}, window={self.window}, "
            f"min_retries_per_second={self.min_retries_per_second})"
        )
