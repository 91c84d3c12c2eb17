"""Hedged requests' settings (``HedgePolicy``), checked when made; ``state.py``
has the delay tracker and the budget, ``_call/hedge_race.py`` the race, and
docs/resilience.md ("Hedged requests") the guide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["HedgePolicy", "checked_hedge"]


def _positive(name: str, value: object, *, upper: float = math.inf) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 < value <= upper)
    ):
        bound = "" if math.isinf(upper) else f" and at most {upper}"
        raise ValueError(f"{name} must be a number above 0{bound}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class HedgePolicy:
    """Send one more attempt of a slow call to another endpoint, and keep the first
    answer (docs/resilience.md, "Hedged requests"). Off unless given.

    After ``delay`` seconds without an answer (a plain call: a complete 2xx; a
    stream: its first chunk), one hedge of the call goes to a different endpoint
    of the same model that is in rotation and not shedding; the first answer
    wins and the other attempt is cancelled, its connection closed so that the
    server aborts it. ``delay=None`` (the default) takes the ``quantile`` of this
    client's recent latencies of the model (a stream's time to its first chunk,
    a plain call's time to its answer), over the last ``window`` calls, once
    ``min_samples`` are in; before that, no hedge. At most ``budget`` of the
    calls with hedging on are hedged (a sliding 10 s window, as the retry
    budget's).

    >>> HedgePolicy().quantile, HedgePolicy().budget, HedgePolicy(delay=0.5).delay
    (0.95, 0.05, 0.5)
    """

    #: Seconds to wait before the hedge; None: the ``quantile`` of recent latencies.
    delay: float | None = None
    #: Which quantile of the model's recent latencies is the delay (0.95: p95).
    quantile: float = 0.95
    #: How many recent latencies per model the quantile reads.
    window: int = 200
    #: Latencies needed before the quantile is trusted (no hedge until then).
    min_samples: int = 20
    #: The share of calls with hedging on that may be hedged (0.05: 5 %).
    budget: float = 0.05

    def __post_init__(self) -> None:
        if self.delay is not None:
            _positive("delay", self.delay)
        _positive("quantile", self.quantile, upper=1.0)
        _positive("budget", self.budget, upper=1.0)
        for name in ("window", "min_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
                raise ValueError(f"{name} must be an integer from 1 to 10000, got {value!r}")
        if self.min_samples > self.window:
            raise ValueError(
                f"min_samples ({self.min_samples}) cannot exceed window ({self.window})"
            )


def checked_hedge(value: object) -> HedgePolicy | None:
    """``value`` as the ``hedge`` option: a ``HedgePolicy`` or None."""
    if value is not None and not isinstance(value, HedgePolicy):
        raise TypeError(
            f"hedge must be a stormguard.HedgePolicy or None, got {type(value).__name__}"
        )
    return value
