"""Noticing that the HTTP client went away, to stop work nobody will read.

After the body is read, the next ASGI ``receive()`` message is
``http.disconnect`` when the client closes the connection. Racing the work
against that message lets a queued request leave the queue, and a running one
be aborted in the engine, as soon as the caller gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work finished; the work was cancelled."""


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client has disconnected."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``; cancel it and raise ``ClientGone`` if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone
