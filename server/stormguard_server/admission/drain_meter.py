"""``DrainMeter``: amounts released per second over a recent period, behind the
request limits' Retry-After (``http/request_limits.py``)."""

from __future__ import annotations

from collections import deque

from stormguard_server.clock import ClockLike, as_clock


class DrainMeter:
    """Amounts released per second over the last ``period_s`` seconds (the request
    limits' pools measure their drain with it; admission's own wait estimate is
    ``HoldMeter``)."""

    def __init__(self, period_s: float, clock: ClockLike | None = None) -> None:
        self._period_s = period_s
        self._clock = as_clock(clock)
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0
        self._started: float | None = None

    def start(self) -> None:
        """Begin measuring: the rate's span starts here (the request limits' pools
        call it at their first take; else it starts at the first release)."""
        if self._started is None:
            self._started = self._clock.now()

    def record(self, tokens: int) -> None:
        now = self._clock.now()
        self.start()
        self._events.append((now, tokens))
        self._total += tokens
        self._trim(now)

    def rate(self) -> float | None:
        """Amounts per second, or None before anything was released."""
        now = self._clock.now()
        self._trim(now)
        if self._started is None or not self._events:
            return None
        span = min(self._period_s, max(now - self._started, 0.0))
        span = max(span, 0.1)  # one burst of releases is not an infinite rate
        return self._total / span

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self._period_s:
            _, tokens = self._events.popleft()
            self._total -= tokens
