"""The next piece of an async body, its wait held to a bound, with a timer only
when it waits.

A fast stream hands over most pieces without waiting: httpx has them buffered
(one network read brings many SSE events). An ``anyio.fail_after`` scope around
each read costs a timer on the event loop and anyio's task bookkeeping, about a
third of an async stream's CPU per chunk. So on asyncio the read is started
outside any bound; a piece that comes at once is returned as it is (a read that
never waits cannot be cut by a timer either), and only a read that must wait
goes on under ``asyncio.timeout``. A bare yield to the event loop is not a
wait: anyio's checkpoints (httpcore takes an anyio lock as a body ends, which
yields once even when the lock is free) go on without a timer, which is armed
at the first step that waits on a future. ``await_within`` does the same for
an attempt's body read, which then needs no timer when the body came with the
headers. An attempt's send always waits (for the server), so ``await_bounded``
bounds it from the start, without the step-by-step drive: two coroutines and a
generator fewer alive while a call waits for its answer.

Not an anyio scope there: the read may already be inside scopes of its own
(httpcore bounds each socket read with one), and anyio scopes must be left in
the order they were entered; ``asyncio.timeout`` keeps no such stack. Off
asyncio (trio), and on Python 3.10 (no ``asyncio.timeout``), the whole read
runs in ``anyio.fail_after``, as before.
"""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator, Awaitable, Generator
from typing import Any, TypeVar

import anyio

__all__ = ["anext_within", "await_bounded", "await_within"]

_T = TypeVar("_T")
#: ``asyncio.timeout`` is new in Python 3.11.
_ASYNCIO_TIMEOUT: bool = sys.version_info >= (3, 11)


async def anext_within(items: AsyncIterator[_T], seconds: float | None) -> _T:
    """``await items.__anext__()``, ended by ``TimeoutError`` after ``seconds``
    (None: unbounded) of waiting; ``StopAsyncIteration`` at the end."""
    asyncio = _running_asyncio()
    if asyncio is None:
        with anyio.fail_after(seconds):
            return await items.__anext__()
    step: Any = items.__anext__()
    try:
        waiting = step.send(None)
    except StopIteration as done:  # at hand: most pieces of a fast stream
        return done.value  # type: ignore[no-any-return]
    return await _waited(asyncio, step, waiting, seconds)  # type: ignore[no-any-return]


async def await_within(awaitable: Awaitable[_T], seconds: float | None) -> _T:
    """``await awaitable``, ended by ``TimeoutError`` after ``seconds`` (None:
    unbounded) of waiting, with a timer only once it waits (module doc); off
    asyncio in ``anyio.fail_after``."""
    asyncio = _running_asyncio()
    if asyncio is None:
        with anyio.fail_after(seconds):
            return await awaitable
    step: Any = awaitable.__await__()
    try:
        waiting = step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return await _waited(asyncio, step, waiting, seconds)  # type: ignore[no-any-return]


async def await_bounded(awaitable: Awaitable[_T], seconds: float | None) -> _T:
    """``await awaitable``, ended by ``TimeoutError`` after ``seconds`` (None:
    unbounded), its timer armed at once: for an awaitable that waits anyway (an
    attempt's send); off asyncio in ``anyio.fail_after``."""
    asyncio = _running_asyncio()
    if asyncio is None:
        with anyio.fail_after(seconds):
            return await awaitable
    async with asyncio.timeout(seconds):
        return await awaitable


def _running_asyncio() -> Any:
    """The asyncio module when it runs this task and has ``asyncio.timeout``, else
    None (trio; Python 3.10). Not imported here: a sync program never loads it."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None or not _ASYNCIO_TIMEOUT or asyncio._get_running_loop() is None:
        return None
    return asyncio


async def _waited(asyncio: Any, step: Any, waiting: object, seconds: float | None) -> Any:
    """Go on with ``step``, started, that yielded ``waiting``: as it is while it
    does not wait, under ``asyncio.timeout(seconds)`` from its first wait."""
    if waiting is None:  # a bare yield: a checkpoint (``sleep(0)``), not a wait
        finished, waiting = await _drive(step, waiting, to_first_wait=True)
        if finished:
            return waiting
    async with asyncio.timeout(seconds):
        return (await _drive(step, waiting, to_first_wait=False))[1]


@types.coroutine
def _drive(
    step: Any, waiting: object, *, to_first_wait: bool
) -> Generator[Any, Any, tuple[bool, Any]]:
    """Go on with ``step``, a coroutine already started that now yields ``waiting``:
    what the event loop sends or throws (a cancellation) goes to it. Returns
    ``(True, its result)`` when it finishes; with ``to_first_wait``, ``(False, what
    it waits on)`` as soon as it waits on something (not a bare yield: anyio's
    checkpoints, a lock taken at once, which no timer needs to bound)."""
    while True:
        try:
            sent = yield waiting
        except GeneratorExit:
            step.close()
            raise
        except BaseException as exc:
            try:
                waiting = step.throw(exc)
            except StopIteration as done:
                return True, done.value
        else:
            try:
                waiting = step.send(sent)
            except StopIteration as done:
                return True, done.value
        if to_first_wait and waiting is not None:
            return False, waiting
