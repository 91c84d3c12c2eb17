"""anext_within: the next item of an async iterator, its wait bounded, with a timer
only when it waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import anyio
import pytest

from stormguard._io.read_within import anext_within, await_within


async def _ready(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def test_items_at_hand_come_without_waiting_then_the_end() -> None:
    items = _ready(b"a", b"b")
    assert await anext_within(items, 5.0) == b"a"
    assert await anext_within(items, None) == b"b"
    with pytest.raises(StopAsyncIteration):
        await anext_within(items, 5.0)


async def test_a_wait_that_ends_in_time_returns_the_item() -> None:
    gate = asyncio.Event()

    async def gated() -> AsyncIterator[bytes]:
        await gate.wait()
        yield b"late"

    read = asyncio.ensure_future(anext_within(gated(), 60.0))
    await asyncio.sleep(0)  # the read has started and waits on the gate
    assert not read.done()
    gate.set()
    assert await read == b"late"


async def test_a_wait_past_the_bound_is_a_timeout_and_closes_the_read() -> None:
    closed = asyncio.Event()

    async def stalled() -> AsyncGenerator[bytes, None]:
        try:
            await asyncio.Event().wait()
            yield b"never"
        finally:
            closed.set()

    items = stalled()
    with pytest.raises(TimeoutError):
        await anext_within(items, 0.01)
    await items.aclose()
    assert closed.is_set()


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    started = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        started.set()
        await asyncio.Event().wait()
        yield b"never"

    read = asyncio.ensure_future(anext_within(stalled(), 60.0))
    await started.wait()
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read


async def test_the_iterators_own_cancel_scopes_are_left_in_order() -> None:
    """httpcore bounds each socket read with an anyio scope of its own: entered in
    the read's first step, it must still be left cleanly, in time or cut."""
    gate = asyncio.Event()

    async def scoped(bound: float) -> AsyncIterator[bytes]:
        while True:
            with anyio.fail_after(bound):
                await gate.wait()
            gate.clear()
            yield b"piece"

    items = scoped(60.0)
    read = asyncio.ensure_future(anext_within(items, 60.0))
    await asyncio.sleep(0)
    gate.set()
    assert await read == b"piece"
    with pytest.raises(TimeoutError):  # the iterator's own bound
        await anext_within(scoped(0.01), 60.0)
    with pytest.raises(TimeoutError):  # ours, around the iterator's
        await anext_within(scoped(60.0), 0.01)
    async with anyio.create_task_group():  # anyio's state of this task is intact
        pass


class _CountedTimeouts:
    """Counts the ``asyncio.timeout`` scopes entered (the timers armed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = 0
        real = asyncio.timeout

        def counted(delay: float | None) -> asyncio.Timeout:
            self.armed += 1
            return real(delay)

        monkeypatch.setattr(asyncio, "timeout", counted)


async def test_bare_yields_to_the_loop_arm_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """anyio's checkpoints (a lock taken at once, ``sleep(0)``) yield to the event loop
    without waiting on anything: no timer, for an item or for any awaitable."""
    timeouts = _CountedTimeouts(monkeypatch)

    async def checkpointed() -> AsyncIterator[bytes]:
        await asyncio.sleep(0)
        yield b"a"
        await asyncio.sleep(0)

    async def answer() -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return 42

    items = checkpointed()
    assert await anext_within(items, 5.0) == b"a"
    with pytest.raises(StopAsyncIteration):
        await anext_within(items, 5.0)
    assert await await_within(answer(), 5.0) == 42
    assert timeouts.armed == 0


async def test_a_real_wait_after_bare_yields_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts = _CountedTimeouts(monkeypatch)

    async def checkpoint_then_stall() -> int:
        await asyncio.sleep(0)
        await asyncio.Event().wait()
        return 1

    with pytest.raises(TimeoutError):
        await await_within(checkpoint_then_stall(), 0.01)
    assert timeouts.armed == 1


async def test_await_within_returns_what_comes_in_time_and_raises_what_it_raises() -> None:
    gate = asyncio.Event()

    async def gated() -> str:
        await gate.wait()
        return "late"

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    read = asyncio.ensure_future(await_within(gated(), 60.0))
    await asyncio.sleep(0)
    assert not read.done()
    gate.set()
    assert await read == "late"
    with pytest.raises(ValueError, match="boom"):
        await await_within(failing(), 60.0)


async def test_a_cancellation_during_bare_yields_stays_a_cancellation() -> None:
    reached = asyncio.Event()

    async def spinning() -> None:
        while True:
            reached.set()
            await asyncio.sleep(0)

    task = asyncio.ensure_future(await_within(spinning(), 60.0))
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
