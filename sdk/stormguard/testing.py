"""Helpers for testing code that uses stormguard, without waiting for real time."""

from __future__ import annotations

import threading

from ._core.clock import Clock

__all__ = ["FakeClock"]


class FakeClock(Clock):
    """A clock that only moves when told to or when something sleeps on it.

    >>> clock = FakeClock()
    >>> clock.sleep(1.5); clock.now(), clock.sleeps
    (1.5, [1.5])
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        #: Every sleep asked for, in order (sync and async).
        self.sleeps: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self._now += max(seconds, 0.0)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
