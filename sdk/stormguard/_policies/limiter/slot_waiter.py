"""A call waiting for a slot of an endpoint's limit, from a thread or from a task.

``SlotWaiter.wait`` blocks a thread and ``wait_async`` suspends a task; both end
granted (a ``Lease``), refused (``QueueTimeoutError``) or at the call's deadline,
and both sleep through a pause of the endpoint on its clock. The queue that
grants and refuses is ``_policies/limiter/endpoint_limit.py``; a waiter knows it only as a
``WaitQueue``, so that module builds on this one, not the other way round.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..._core.exceptions import QueueTimeoutError

if TYPE_CHECKING:
    import asyncio

    from ..._core.clock import Clock
    from .lease import Lease

__all__ = ["SlotWaiter", "WaitQueue"]


class WaitQueue(Protocol):
    """The queue's side of a wait, as ``EndpointLimit`` keeps it: every call takes its
    lock, so a waiter never reads the queue's state itself."""

    #: The endpoint's clock: a pause is slept through on it.
    clock: Clock

    def _on_wake(self, waiter: SlotWaiter, wake: Callable[[], None]) -> bool:
        """Give the waiter its wake-up; True when it is already settled."""
        ...

    def _pause_for(self, waiter: SlotWaiter) -> float:
        """Seconds the waiter sleeps through a pause (0: not paused)."""
        ...

    def _resume(self, waiter: SlotWaiter) -> bool:
        """After a sleep: grant what may go now; True when the waiter is settled."""
        ...

    def _finish_wait(self, waiter: SlotWaiter) -> Lease:
        """After the wait: the lease, or raise the waiter's error."""
        ...

    def _abandon(self, waiter: SlotWaiter) -> None:
        """The wait was interrupted: leave the queue, hand back a slot granted meanwhile."""
        ...


class SlotWaiter:
    """A call waiting for a slot. The driver waits with ``wait`` (a thread) or
    ``wait_async`` (a task); both return the granted ``Lease`` or raise
    ``QueueTimeoutError``. One waiter is woken per freed slot."""

    __slots__ = (
        "_error",
        "_lease",
        "_limit",
        "_wake",
        "deadline_at",
        "enqueued_at",
        "key",
    )

    def __init__(self, limit: WaitQueue, key: tuple[int, int], deadline_at: float) -> None:
        self._limit = limit
        self.key = key
        self.deadline_at = deadline_at
        self.enqueued_at = limit.clock.now()
        self._lease: Lease | None = None
        self._error: QueueTimeoutError | None = None
        self._wake: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        return self._lease is not None or self._error is not None

    def _resolve(self, lease: Lease | None, error: QueueTimeoutError | None) -> Callable[[], None]:
        """Under the limit's lock: settle the waiter; returns its wake-up, to call unlocked."""
        self._lease, self._error = lease, error
        return self._wake or _nothing

    def _outcome(self) -> Lease:
        if self._lease is not None:
            return self._lease
        assert self._error is not None
        raise self._error

    def wait(self, timeout: float | None) -> Lease:
        """Block the thread until granted, refused, or ``timeout`` (the call's deadline)."""
        event = threading.Event()
        end = _End(timeout)
        limit = self._limit
        try:
            if not limit._on_wake(self, event.set):
                while True:
                    pause = limit._pause_for(self)
                    if pause > 0:
                        # Nothing is granted during a pause: sleep through it on the
                        # limiter's clock (a test's fake clock moves), then look again.
                        limit.clock.sleep(pause)
                    else:
                        event.wait(end.left())
                        event.clear()  # woken without a slot: a pause began
                    if self._settled_or_over(end):
                        break
        except BaseException:  # KeyboardInterrupt in the wait
            limit._abandon(self)
            raise
        return limit._finish_wait(self)

    async def wait_async(self, timeout: float | None) -> Lease:
        """Suspend the task until granted, refused, or ``timeout``; a cancelled task
        leaves the queue (and gives back a slot granted meanwhile).

        One future per wait, awaited directly: a release on the loop's own thread
        settles it at once, so the task runs on the loop's next pass, not after
        the several hops (and a self-pipe write) of ``call_soon_threadsafe``,
        ``shield`` and ``wait_for``, each of which waits behind every ready task
        when hundreds are queued. Another thread goes through
        ``call_soon_threadsafe``."""
        import asyncio  # here, not at module level: sync users never load asyncio

        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        current: list[asyncio.Future[None]] = [loop.create_future()]
        end = _End(timeout)
        limit = self._limit

        def wake() -> None:  # any thread
            if threading.get_ident() == loop_thread:
                _set_result(current[0])
            else:
                loop.call_soon_threadsafe(lambda: _set_result(current[0]))

        try:
            if not limit._on_wake(self, wake):
                while True:
                    pause = limit._pause_for(self)
                    if pause > 0:
                        await limit.clock.asleep(pause)
                    else:
                        await _until(loop, current[0], end.left())
                        current[0] = loop.create_future()
                    if self._settled_or_over(end):
                        break
        except BaseException:
            limit._abandon(self)
            raise
        return limit._finish_wait(self)

    def _settled_or_over(self, end: _End) -> bool:
        """After a wake-up: granted or refused, out of time, or granted just now (a
        pause that ended with nobody to notice)."""
        limit = self._limit
        return (
            self.done or end.over() or limit.clock.now() >= self.deadline_at or limit._resume(self)
        )


class _End:
    """When a wait gives up, on the monotonic clock (None: never)."""

    __slots__ = ("_at",)

    def __init__(self, timeout: float | None) -> None:
        self._at = None if timeout is None else time.monotonic() + max(timeout, 0.0)

    def left(self) -> float | None:
        return None if self._at is None else max(self._at - time.monotonic(), 0.0)

    def over(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0


def _nothing() -> None:
    return None


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _until(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], timeout: float | None
) -> None:
    """Wait for ``future`` to be set, at most ``timeout`` seconds (None: no limit);
    a timeout is not an error here (the caller looks at the waiter next)."""
    if future.done():
        return
    if timeout is None:
        await future
        return
    if timeout <= 0:
        return
    timer = loop.call_later(timeout, _set_result, future)
    try:
        await future
    finally:
        timer.cancel()
