"""Latency-aware choice's settings (``LatencyRouting``), checked when made;
``_policies/routing/peak_ewma.py`` has the estimate and the cost, and
docs/resilience.md ("Latency-aware choice") the guide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DEFAULT_DECAY", "LatencyRouting", "checked_latency"]

#: Seconds over which a latency estimate decays: Finagle's default ``decayTime``
#: and Linkerd's default decay for its peak-EWMA balancer. At a few calls a second
#: it spans tens of answers; an endpoint ten times slower than the others is tried
#: again after roughly ``decay * ln(10 / (their load + 1))`` seconds.
DEFAULT_DECAY = 10.0


@dataclass(frozen=True, kw_only=True)
class LatencyRouting:
    """Rank endpoints of several by how fast they have answered this client, as well
    as by load (docs/resilience.md, "Latency-aware choice"). Off unless given.

    Each endpoint keeps a peak-EWMA estimate of its time to a stream's first chunk
    and of a plain call's latency per completion token; a call's power-of-two
    choice compares ``(load + 1) * estimate`` of its kind instead of load alone. A
    slower answer than the estimate replaces it at once; faster ones are averaged
    in over about ``decay`` seconds, and an endpoint not heard from decays toward
    zero over the same time, so an avoided endpoint is tried again.

    >>> LatencyRouting().decay
    10.0
    """

    #: The time constant in seconds of the estimate's average and of its decay.
    decay: float = DEFAULT_DECAY

    def __post_init__(self) -> None:
        decay = self.decay
        if (
            isinstance(decay, bool)
            or not isinstance(decay, (int, float))
            or not (math.isfinite(decay) and decay > 0)
        ):
            raise ValueError(f"decay must be a positive finite number of seconds, got {decay!r}")


def checked_latency(value: object) -> LatencyRouting | None:
    """``value`` as the ``latency_routing`` option: a ``LatencyRouting`` or None."""
    if value is not None and not isinstance(value, LatencyRouting):
        raise TypeError(
            "latency_routing must be a stormguard.LatencyRouting or None,"
            f" got {type(value).__name__}"
        )
    return value
