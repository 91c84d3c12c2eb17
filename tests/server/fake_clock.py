"""A fake ``Clock`` for a whole in-process server: virtual time that moves only when
the test lets it, so engine steps, warm-up, restarts, stalls, deadlines and queue
timeouts take no real time and no machine load can make them late.

Every sleep and timed wait on the clock sets an alarm. ``advance(seconds)`` rings
the alarms due in that span one time after another, letting the event loop run
what each one woke before the next; ``run_until(predicate)`` rings them one by
one until the predicate holds, as a loop that jumps over idle time would;
``drive(awaitable)`` runs a request that way until it is answered.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from stormguard_server.clock import Clock

T = TypeVar("T")

# Virtual seconds ``run_until`` lets pass before it gives up (a test that waits for
# something that never happens fails instead of running the clock forever).
_LIMIT_S = 600.0


async def settle() -> None:
    """Return once every task that can run has run: the loop has nothing ready but
    this task (in-process servers do no I/O, so nothing else can wake them)."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)  # asyncio's run queue (CPython's base loop)
    for _ in range(100_000):
        await asyncio.sleep(0)
        if ready is not None and not ready:
            # Once more: a callback may have been queued by the last one that ran.
            await asyncio.sleep(0)
            if not ready:
                return
    if ready is not None:
        raise AssertionError("the event loop never went idle")


class FakeClock(Clock):
    """Virtual monotonic time with alarms; see the module docstring."""

    def __init__(self, start: float = 1000.0, *, wall_start: float = 1.8e9) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._alarms: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    # -- the Clock --------------------------------------------------------

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        await self._alarm(self._now + seconds)

    async def wait(self, future: asyncio.Future[Any], timeout: float) -> bool:
        if future.done() or timeout <= 0:
            await asyncio.sleep(0)
            return future.done()
        alarm = self._alarm(self._now + timeout)
        try:
            await asyncio.wait({future, alarm}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            alarm.cancel()
        return future.done()

    # -- moving time ------------------------------------------------------

    @property
    def next_alarm(self) -> float | None:
        """When the next alarm rings (None: nothing waits on the clock)."""
        while self._alarms and self._alarms[0][2].done():  # cancelled sleepers
            heapq.heappop(self._alarms)
        return self._alarms[0][0] if self._alarms else None

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, alarm by alarm."""
        target = self._now + seconds
        await settle()
        while (at := self.next_alarm) is not None and at <= target:
            self._ring(at)
            await settle()
        self._now = max(self._now, target)
        await settle()

    async def run_until(self, predicate: Callable[[], bool], *, limit_s: float = _LIMIT_S) -> None:
        """Ring alarms one after another until ``predicate()`` holds; fail if it does
        not within ``limit_s`` virtual seconds."""
        end = self._now + limit_s
        while True:
            await settle()
            if predicate():
                return
            at = self.next_alarm
            if at is None or at > end:
                raise AssertionError(f"not reached within {limit_s} s of virtual time")
            self._ring(at)

    async def drive(self, awaitable: Awaitable[T], *, limit_s: float = _LIMIT_S) -> T:
        """Await ``awaitable`` while virtual time runs (a request to a fake-clock server)."""
        task = asyncio.ensure_future(awaitable)
        try:
            await self.run_until(task.done, limit_s=limit_s)
        finally:
            if not task.done():
                task.cancel()
        return await task

    # -- internals --------------------------------------------------------

    def _alarm(self, at: float) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._alarms, (at, next(self._order), future))
        return future

    def _ring(self, at: float) -> None:
        """Move to ``at`` and wake every sleeper due then."""
        self._now = max(self._now, at)
        while self._alarms and self._alarms[0][0] <= self._now:
            _, _, future = heapq.heappop(self._alarms)
            if not future.done():
                future.set_result(None)
