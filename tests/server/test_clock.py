"""The server's clock seam: one clock from the app factory to every part that reads
time, and the fake clock the in-process tests drive."""

from __future__ import annotations

import asyncio

import pytest

from stormguard_server.app import build_state
from stormguard_server.clock import Clock, as_clock
from stormguard_server.config import ServerConfig
from tests.server.conftest import FAST_ENGINE
from tests.server.fake_clock import FakeClock


def test_as_clock_takes_a_clock_a_function_or_nothing() -> None:
    clock = Clock()
    assert as_clock(clock) is clock
    assert as_clock(lambda: 12.5).now() == 12.5
    assert type(as_clock(None)) is Clock
    with pytest.raises(TypeError):
        as_clock(3.0)  # type: ignore[arg-type]


async def test_the_system_clock_waits_without_cancelling_what_it_waits_for() -> None:
    clock = Clock()
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert await clock.wait(future, 0.001) is False
    assert not future.cancelled()
    future.set_result(None)
    assert await clock.wait(future, 10.0) is True


async def test_the_fake_clock_rings_alarms_in_order_and_only_when_moved() -> None:
    clock = FakeClock(start=0.0)
    woken: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woken.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("b", 2.0), ("a", 1.0))]
    await asyncio.sleep(0.01)  # real time passes; virtual time does not
    assert woken == [] and clock.now() == 0.0
    await clock.advance(1.5)
    assert woken == [("a", 1.0)] and clock.now() == 1.5
    await clock.advance(1.0)
    assert woken == [("a", 1.0), ("b", 2.0)] and clock.now() == 2.5
    await asyncio.gather(*tasks)
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert await clock.drive(clock.wait(future, 3.0)) is False
    assert clock.now() == 5.5


async def test_one_clock_reaches_the_engine_faults_admission_and_requests() -> None:
    clock = FakeClock()
    state = build_state(ServerConfig(engine=FAST_ENGINE), clock=clock)
    assert state.clock is clock and state.admission is not None and state.faults is not None
    state.faults.stall(2.0)
    await clock.advance(1.5)
    assert state.faults.stall_remaining() == pytest.approx(0.5)
    state.faults.stall(0)
    assert state.admission.make_ticket(10).arrival == clock.now()
    assert state.engine.load().state == "stopped"
    await clock.drive(state.engine.start())  # the warm-up probe runs in virtual time
    assert state.engine.load().ready
    await state.engine.stop()
