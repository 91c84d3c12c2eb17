"""The one seam through which the server reads time, sleeps and waits with a timeout.

The app factory (``app.build_state``) makes one ``Clock`` and hands it to the
engine, its faults, admission (queue timeouts, hold times, Retry-After), the
request limits, each request's flight and the tracing spans, so a test can give
a whole in-process server a fake clock and drive warm-up, restarts, stalls,
deadlines and queue timeouts without waiting for them. Only the connections'
read deadlines (``connections.py``) stay on the event loop's clock: they guard
real sockets under uvicorn and are tested over real sockets.

Wall-clock stamps on the wire (a completion's ``created``) are not read here:
they are dates, not durations.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Clock", "ClockLike", "as_clock"]


class Clock:
    """Monotonic time, sleeping and timed waits on the event loop; subclass it to fake time."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        return time.monotonic()

    def wall(self) -> float:
        """Seconds since the epoch at ``now()`` (span timestamps)."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Suspend the task for ``seconds``."""
        await asyncio.sleep(max(seconds, 0.0))

    async def wait(self, future: asyncio.Future[Any], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for ``future``; whether it is done. The
        future is never cancelled by the timeout."""
        done, _ = await asyncio.wait({future}, timeout=max(timeout, 0.0))
        return bool(done)


class _ReadClock(Clock):
    """A clock that reads time from a function and sleeps on the event loop: what a
    component given only ``now`` (a test's manual clock) uses."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


#: A clock as a component takes it: a ``Clock``, or a function of monotonic seconds
#: (time is then read from it, and sleeps are real).
ClockLike = Clock | Callable[[], float]


def as_clock(clock: ClockLike | None) -> Clock:
    """The ``Clock`` for ``clock``: itself, one reading a function, or the system's.

    >>> as_clock(lambda: 5.0).now()
    5.0
    """
    if clock is None:
        return Clock()
    if isinstance(clock, Clock):
        return clock
    if callable(clock):
        return _ReadClock(clock)
    raise TypeError(f"clock must be a Clock or a function, got {type(clock).__name__}")
