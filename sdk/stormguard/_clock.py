"""The one seam through which stormguard reads time and sleeps.

Every policy takes a clock so that tests (ours and our users') run retry
schedules, budgets and deadlines without waiting: see ``stormguard.testing``.
"""

from __future__ import annotations

import time

import anyio

__all__ = ["Clock", "SystemClock"]


class Clock:
    """Monotonic time and sleeping; subclass it to fake time."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block the thread for ``seconds``."""
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        """Suspend the task for ``seconds``; cancellable (asyncio and anyio cancel scopes)."""
        await anyio.sleep(max(seconds, 0.0))


SystemClock = Clock
