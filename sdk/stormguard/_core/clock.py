"""The one seam through which stormguard reads time and sleeps.

Every policy takes a clock so that tests (ours and our users') run retry
schedules, budgets and deadlines without waiting: see ``stormguard.testing``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

__all__ = ["Clock", "ClockLike", "ClockRef", "SystemClock"]


class Clock:
    """Monotonic time and sleeping; subclass it to fake time."""

    #: Seconds on a monotonic clock. ``time.monotonic`` itself, not a method that
    #: calls it: a call reads the clock a score of times. Override it with a method.
    now: Callable[[], float] = staticmethod(time.monotonic)

    def sleep(self, seconds: float) -> None:
        """Block the thread for ``seconds``."""
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        """Suspend the task for ``seconds``; cancellable (asyncio and anyio cancel scopes)."""
        await anyio.sleep(max(seconds, 0.0))


SystemClock = Clock


#: A clock as a component takes it: a ``Clock`` or a function of monotonic seconds.
ClockLike = Clock | Callable[[], float]


class ClockRef:
    """The clock a component reads: the one it was given, else its client's once a
    client adopts it (``Client(clock=FakeClock(), token_policy=TokenPolicy())``: the
    policy's lookups and rate limit follow the fake clock too), else the system's."""

    __slots__ = ("given", "now")

    def __init__(self, clock: ClockLike | None) -> None:
        #: Whether the component was given a clock of its own (then it keeps it).
        self.given = clock is not None
        self.now: Callable[[], float] = _reader(clock)

    def adopt(self, clock: ClockLike) -> bool:
        """Read ``clock`` from now on, unless a clock was given; whether it changed."""
        reader = _reader(clock)
        if self.given or reader == self.now:
            return False
        self.now = reader
        return True


def _reader(clock: ClockLike | None) -> Callable[[], float]:
    if clock is None:
        return time.monotonic
    if isinstance(clock, Clock):
        return clock.now
    if callable(clock):
        return clock
    raise TypeError(f"clock must be a stormguard Clock or a function, got {type(clock).__name__}")
