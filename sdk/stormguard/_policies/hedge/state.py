"""What a client's hedged calls share (``HedgeState``): each model's recent
latencies, whose quantile is the delay before a hedge, and the budget that
bounds the share of calls hedged.

The delay follows "The Tail at Scale" (Dean and Barroso, 2013): hedge a request
once it has waited longer than the 95th percentile of its kind, so that about
5 % of calls send a second request. The latencies are a bounded window per
model (the last ``HedgePolicy.window`` answers), and a bounded number of models
(``MAX_MODELS``: the oldest model seen is forgotten first), so the table cannot
grow with what callers send.

The budget is the retry budget's machinery (``_policies/retry/budget.py``,
Finagle's): hedges may not exceed ``HedgePolicy.budget`` times the calls with
hedging on over a sliding 10 s window, with no floor: a hedge is a bet on the
tail, not a way through a fault.
"""

from __future__ import annotations

import math
from collections import deque

from ..._core.clock import Clock
from ..._core.fork import fork_safe_lock
from ..retry.budget import BudgetSnapshot, RetryBudget
from .policy import HedgePolicy

__all__ = ["MAX_MODELS", "HedgeState", "LatencyWindow"]

#: Models whose latencies a client keeps (past them, the oldest is forgotten).
MAX_MODELS = 64
#: Budgets a client keeps, one per share in use (past them, it starts again).
_MAX_BUDGETS = 8


class LatencyWindow:
    """The last ``size`` latencies of one model, and their quantiles (nearest rank,
    computed again only after a new latency). Not thread-safe on its own."""

    __slots__ = ("_cached", "_samples")

    def __init__(self, size: int) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._cached: tuple[float, float] | None = None

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, seconds: float, size: int) -> None:
        if size != self._samples.maxlen:  # another policy's window: keep the newest
            self._samples = deque(self._samples, maxlen=size)
        self._samples.append(seconds)
        self._cached = None

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (nearest rank) of the latencies held; needs one."""
        cached = self._cached
        if cached is not None and cached[0] == q:
            return cached[1]
        ordered = sorted(self._samples)
        value = ordered[max(math.ceil(q * len(ordered)) - 1, 0)]
        self._cached = (q, value)
        return value


class HedgeState:
    """Shared by every thread and task of a client and its ``with_options`` copies."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = fork_safe_lock()
        self._latencies: dict[str | None, LatencyWindow] = {}
        self._budgets: dict[float, RetryBudget] = {}

    def delay_for(self, model: str | None, policy: HedgePolicy) -> float | None:
        """The wait before a hedge of a call to ``model`` (None: no hedge yet, too few
        latencies known)."""
        if policy.delay is not None:
            return policy.delay
        with self._lock:
            window = self._latencies.get(model)
            if window is None or len(window) < policy.min_samples:
                return None
            return window.quantile(policy.quantile)

    def observe(self, model: str | None, seconds: float, policy: HedgePolicy) -> None:
        """A call to ``model`` answered after ``seconds`` (its first chunk, for a stream)."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        with self._lock:
            window = self._latencies.get(model)
            if window is None:
                if len(self._latencies) >= MAX_MODELS:
                    del self._latencies[next(iter(self._latencies))]
                window = self._latencies[model] = LatencyWindow(policy.window)
            window.add(seconds, policy.window)

    def _budget(self, policy: HedgePolicy) -> RetryBudget:
        with self._lock:
            budget = self._budgets.get(policy.budget)
            if budget is None:
                if len(self._budgets) >= _MAX_BUDGETS:
                    self._budgets.clear()
                budget = self._budgets[policy.budget] = RetryBudget(
                    ratio=policy.budget, min_retries_per_second=0.0, clock=self._clock
                )
            return budget

    def record_call(self, policy: HedgePolicy) -> None:
        """Count one call with hedging on (each lets ``budget`` of a hedge happen)."""
        self._budget(policy).record_call()

    def try_spend(self, policy: HedgePolicy) -> bool:
        """Take one hedge from the budget; False (nothing taken) when it is empty."""
        return self._budget(policy).try_spend()

    def budget_state(self, policy: HedgePolicy) -> BudgetSnapshot:
        """Calls, hedges (as ``retries``) and what is left over the current window."""
        return self._budget(policy).state()

    def models(self) -> int:
        """How many models' latencies are kept."""
        with self._lock:
            return len(self._latencies)
