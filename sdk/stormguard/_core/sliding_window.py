"""Two counters over a sliding time window, in fixed memory.

The retry budget (calls, retries over 10 s) and adaptive throttling
(requests, accepts over 120 s) both need "how many in the last N seconds",
shared by every thread of a client, whatever the call rate. A ring of time
buckets gives that in O(buckets) memory; the window slides one bucket at a
time. Not thread-safe on its own: its owners hold their lock around it (they
read and update it together with their own decisions).
"""

from __future__ import annotations

import math

from .clock import Clock

__all__ = ["SlidingWindowCounts"]


class SlidingWindowCounts:
    """Two event counts ``(a, b)`` over a sliding time window, kept per time bucket;
    ``totals()`` sums the live buckets."""

    __slots__ = ("_clock", "_ring", "_width")

    def __init__(self, *, window: float, buckets: int, clock: Clock) -> None:
        if not (math.isfinite(window) and window > 0):
            raise ValueError(f"window must be a positive number of seconds, got {window!r}")
        if buckets < 1:
            raise ValueError("buckets must be at least 1")
        self._clock = clock
        self._width = window / buckets
        # [epoch, a, b] per bucket; a bucket whose epoch is stale counts as empty.
        self._ring = [[-1, 0, 0] for _ in range(buckets)]

    def _slot(self) -> list[int]:
        epoch = math.floor(self._clock.now() / self._width)
        slot = self._ring[epoch % len(self._ring)]
        if slot[0] != epoch:
            slot[0], slot[1], slot[2] = epoch, 0, 0
        return slot

    def add(self, a: int = 0, b: int = 0) -> None:
        """Count ``a`` and ``b`` events now."""
        slot = self._slot()
        slot[1] += a
        slot[2] += b

    def totals(self) -> tuple[int, int]:
        """``(a, b)`` summed over the window ending now."""
        epoch = math.floor(self._clock.now() / self._width)
        oldest = epoch - len(self._ring) + 1
        a = b = 0
        for slot_epoch, slot_a, slot_b in self._ring:
            if oldest <= slot_epoch <= epoch:
                a += slot_a
                b += slot_b
        return a, b
