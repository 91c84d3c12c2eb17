"""Calls waiting for a look: one round wakes threads and event loops alike.

A look runs in a thread of its own (``_policies/routing/discovery.py``); the first calls of a
client wait for it within their deadline, a ``Client``'s on a
``threading.Event``, an ``AsyncClient``'s on a future of its own loop, so no
event loop is held while ``getaddrinfo`` runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from ..._core.fork import fork_safe_lock

__all__ = ["LookRound"]


class LookRound:
    """One look, as the calls waiting for it see it."""

    __slots__ = ("_done", "_event", "_lock", "_wakes", "started_at")

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._event = threading.Event()
        self._lock = fork_safe_lock()
        self._wakes: list[Callable[[], None]] = []
        self._done = False

    def finish(self) -> None:
        with self._lock:
            self._done = True
            wakes, self._wakes = self._wakes, []
        self._event.set()
        for wake in wakes:
            wake()

    def wait(self, timeout: float | None) -> None:
        self._event.wait(timeout)

    async def wait_async(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # any thread
            loop.call_soon_threadsafe(_set_result, future)

        with self._lock:
            if self._done:
                return
            self._wakes.append(wake)
        try:
            await asyncio.wait_for(future, timeout)
        except (TimeoutError, asyncio.TimeoutError):  # one class from Python 3.11 on
            pass
        finally:
            with self._lock:
                if wake in self._wakes:
                    self._wakes.remove(wake)


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
