"""What an object the caller did not close does when it is collected.

A stream left without ``close()`` (``break`` out of ``async for``, then nothing),
a ``with_streaming_response`` response whose block was never left, a client never
closed: each holds what other calls wait for (a concurrency slot, a connection of
the pool) and a call that has not ended. When it is collected it gives them back,
its call ends as cancelled, and it warns: a ``ResourceWarning`` that names it
("Unclosed AsyncStream ..."), as asyncio's transports and aiohttp's
``ClientSession`` and ``ClientResponse`` do. (Python shows a ``ResourceWarning``
only when asked: ``-W default``, ``-X dev``, or pytest.)

``__del__`` may run in any thread, at any allocation (the cyclic collector),
while that very thread holds a lock the clean-up needs (the limiter's, the
pool's), or after the event loop has closed. So it does no clean-up itself: it
takes no lock, does not block and does not raise; it hands the clean-up over:

* an async object made on an asyncio loop that is not closed: its ``aclose`` as a
  task on that loop, started through ``loop.call_soon_threadsafe`` (asyncio
  finalizes an abandoned async generator this way; openai-python closes its
  httpx client on the running loop when the client is collected);
* anything else (a sync object; an async one off asyncio, or whose loop is
  closed): a thread of its own, started on first need and fed through a
  ``queue.SimpleQueue``, whose ``put`` is safe in ``__del__`` (it is reentrant:
  made for this). Off its loop an async connection cannot be closed: the slot is
  given back and the call ended; the connection goes with its loop.

A warnings filter that turns ``ResourceWarning`` into an error (``-W error``) makes
``__del__``'s warning an error that Python reports as unraisable, as it does for
its own objects; the clean-up was handed over before it.
"""

from __future__ import annotations

import _thread
import os
import queue
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from .._core.logs import logger
from .._io.pool_life import running_loop

__all__ = ["PoolFinalizer", "aclose_later", "close_later", "warn_unclosed"]

Cleanup = Callable[[], object]
AsyncCleanup = Callable[[], Awaitable[object]]

#: The clean-ups handed to a loop and not finished, each as (its loop, a marker until
#: it starts, then its task): the loop keeps only weak references to its tasks.
_ON_LOOPS: set[tuple[Any, Any]] = set()
#: The reaper's queue and the process it was started in (a forked child starts its own).
_reaper: tuple[int, queue.SimpleQueue[Cleanup]] | None = None


def close_later(cleanup: Cleanup) -> None:
    """Run ``cleanup`` soon in the reaper thread; never blocks, never raises (at
    interpreter shutdown no thread can start, and nothing is left to clean)."""
    global _reaper
    try:
        reaper = _reaper
        pid = os.getpid()
        if reaper is None or reaper[0] != pid:
            # ``_thread``, not ``threading``: ``Thread.start`` takes the threading
            # module's lock and waits for the thread to run; this does neither. Two
            # threads racing here may each start one: both serve, harmlessly.
            tasks: queue.SimpleQueue[Cleanup] = queue.SimpleQueue()
            _thread.start_new_thread(_reap, (tasks,))
            reaper = _reaper = (pid, tasks)
        reaper[1].put(cleanup)
    except Exception:  # noqa: S110 - shutdown: nothing can run it, nothing needs it
        pass


#: Clean-ups the reaper has run (only the reaper writes it).
_reaped = [0]


def _reap(tasks: queue.SimpleQueue[Cleanup]) -> None:
    while True:
        cleanup = tasks.get()
        _reaped[0] += 1
        try:
            cleanup()
        except BaseException:  # one failed clean-up must not end the thread
            logger.debug("Cleaning up an object left unclosed failed", exc_info=True)
        del cleanup  # what it held goes now (and may hand over more), not later


def aclose_later(loop: Any, aclose: AsyncCleanup, off_loop: Cleanup) -> None:
    """Run ``aclose()`` as a task on ``loop`` if it is not closed; else ``off_loop``
    (what can be done without the loop) in the reaper thread."""
    for stale in [entry for entry in list(_ON_LOOPS) if entry[0].is_closed()]:
        _ON_LOOPS.discard(stale)  # a loop closed before it ran the clean-up: not kept alive
    if loop is not None and not loop.is_closed():
        entry = (loop, object())
        _ON_LOOPS.add(entry)
        try:
            loop.call_soon_threadsafe(_start, entry, aclose, off_loop)
            return
        except Exception:  # it closed meanwhile: off the loop, below
            _ON_LOOPS.discard(entry)
    close_later(off_loop)


def _start(entry: tuple[Any, Any], aclose: AsyncCleanup, off_loop: Cleanup) -> None:
    _ON_LOOPS.discard(entry)
    loop = entry[0]
    try:
        task = loop.create_task(aclose())
    except Exception:  # a loop shutting down refuses new tasks
        close_later(off_loop)
        return
    _ON_LOOPS.add((loop, task))
    task.add_done_callback(_done)


def _done(task: Any) -> None:
    _ON_LOOPS.discard((task.get_loop(), task))
    if not task.cancelled() and task.exception() is not None:
        logger.debug("Closing an object left unclosed failed", exc_info=task.exception())


def warn_unclosed(source: object | None, message: str) -> None:
    """The ``ResourceWarning`` of an object collected unclosed (``source``: the object,
    for tracemalloc's "allocated at"). Any failure but the warning itself, made an
    error by a filter, is swallowed: Python may be shutting down."""
    try:
        warnings.warn(message, ResourceWarning, source=source, stacklevel=2)
    except ResourceWarning:
        raise
    except Exception:  # noqa: S110 - at shutdown the warnings machinery may be gone
        pass


class PoolFinalizer:
    """Closes a client's own connection pool once nothing uses it: the client, its
    ``with_options`` copies and every call they made hold it through their
    ``ClientCore`` (a stream may outlive the client it came from)."""

    __slots__ = ("_http", "_what")

    def __init__(self, http: Any, what: str) -> None:
        self._http = http
        self._what = what

    def __del__(self) -> None:
        http = getattr(self, "_http", None)
        if http is None or http.is_closed:
            return
        if hasattr(http, "aclose"):
            aclose_later(running_loop(), http.aclose, _nothing)
            how = "await client.close(), or async with"
        else:
            close_later(http.close)
            how = "client.close(), or with"
        warn_unclosed(None, f"Unclosed {self._what}: close it ({how})")


def _nothing() -> None:
    """Off its loop an async pool cannot be closed: its connections go with the loop."""


async def settled() -> None:
    """Wait until the clean-ups handed over so far have run (for tests): the tasks on
    this loop, the callbacks ready to run on it (asyncio's close of an async generator
    left unfinished, which may hold an object left unclosed), then the reaper's queue;
    again until none hands over more."""
    import asyncio

    loop = asyncio.get_running_loop()
    for _ in range(10_000):  # a bound, should another task keep the loop busy for good
        await asyncio.sleep(0)
        tasks = [item for on, item in list(_ON_LOOPS) if on is loop and asyncio.isfuture(item)]
        tasks += [task for task in asyncio.all_tasks(loop) if _closes_a_generator(task)]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
            del tasks  # a finished clean-up may free what hands over more
            continue
        if getattr(loop, "_ready", None):
            continue
        if _reaper_round() == 0 and not any(on is loop for on, _ in list(_ON_LOOPS)):
            return


def _closes_a_generator(task: Any) -> bool:
    """A task of asyncio's that closes an async generator left unfinished."""
    return type(task.get_coro()).__name__ == "async_generator_athrow"


def reaped(timeout: float = 10.0) -> None:
    """Wait until the reaper is idle (for tests): a clean-up may hand over another
    (the last stream of a client left unclosed, then its pool)."""
    while _reaper_round(timeout):
        pass


def _reaper_round(timeout: float = 10.0) -> int:
    """Wait for the reaper to run what it was handed so far; how many clean-ups it ran."""
    import threading

    if _reaper is None or _reaper[0] != os.getpid():
        return 0
    before = _reaped[0]
    done = threading.Event()
    close_later(done.set)
    if not done.wait(timeout):
        raise TimeoutError("the reaper did not run what it was handed")
    return _reaped[0] - before - 1
