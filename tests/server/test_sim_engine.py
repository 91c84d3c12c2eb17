"""The sim engine's loop on a real event loop with sub-millisecond steps."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from stormguard_server.config import SimEngineConfig
from stormguard_server.engine import (
    DeadlineExceeded,
    EngineCrashed,
    EngineUnavailable,
    GenerationRequest,
    InjectedError,
    TokenDelta,
)
from stormguard_server.faults import FaultState
from stormguard_server.sim_engine import SimEngine

FAST = SimEngineConfig(
    num_kv_blocks=16,
    block_size=16,
    max_model_len=256,
    max_num_seqs=4,
    max_num_batched_tokens=128,
    step_base_s=0.0005,
    prefill_token_s=0.0,
    decode_seq_s=0.0,
    restart_s=0.1,
    slow_start_s=0.2,
)


def request(
    name: str, prompt_tokens: int = 8, max_tokens: int = 5, **kw: object
) -> GenerationRequest:
    return GenerationRequest(
        request_id=name,
        prompt=f"prompt {name}",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        ignore_eos=True,
        **kw,  # type: ignore[arg-type]
    )


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def collect(deltas: AsyncIterator[TokenDelta]) -> list[TokenDelta]:
    return [d async for d in deltas]


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    sim = SimEngine(FAST)
    await sim.start()
    yield sim
    await sim.stop()


async def test_generates_exactly_max_tokens_deterministically(engine: SimEngine) -> None:
    one = await collect(engine.generate(request("a", max_tokens=6)))
    assert one[-1].finish_reason == "length" and one[-1].output_tokens == 6
    two = await collect(engine.generate(request("b", max_tokens=6)))
    assert "".join(d.text for d in one) != "".join(d.text for d in two)  # per-prompt text
    again = await collect(engine.generate(request("a", max_tokens=6)))
    assert "".join(d.text for d in one) == "".join(d.text for d in again)
    assert engine.stats.output_tokens >= 18
    assert engine.load().kv_cache_usage == 0


async def test_stop_string_ends_with_stop(engine: SimEngine) -> None:
    text = "".join(d.text for d in await collect(engine.generate(request("s", max_tokens=10))))
    word = text.split()[2]
    stopped = await collect(engine.generate(request("s", max_tokens=10, stop=(word,))))
    assert stopped[-1].finish_reason == "stop"
    assert word not in "".join(d.text for d in stopped)


async def test_abort_takes_effect_within_a_step(engine: SimEngine) -> None:
    deltas = engine.generate(request("long", max_tokens=200))
    await deltas.__anext__()
    engine.abort("long")
    await until(lambda: engine.stats.requests_aborted == 1)
    assert engine.load().running == 0 and engine.load().kv_cache_usage == 0
    assert engine.stats.output_tokens < 200  # it stopped, not ran to its end


async def test_closing_the_stream_aborts(engine: SimEngine) -> None:
    deltas = engine.generate(request("closed", max_tokens=200))
    await deltas.__anext__()
    await deltas.aclose()  # type: ignore[attr-defined]
    await until(lambda: engine.stats.requests_aborted == 1)
    assert engine.load().running == 0 and engine.stats.output_tokens < 200


async def test_oom_fails_running_and_waiting_then_cold_restart_and_ramp(engine: SimEngine) -> None:
    # 16 blocks x 16 = 256 slots; three 100-token prompts cannot all fit: OOM.
    streams = [
        engine.generate(request(f"r{i}", prompt_tokens=100, max_tokens=50)) for i in range(3)
    ]
    results = await asyncio.gather(*(collect(s) for s in streams), return_exceptions=True)
    assert all(isinstance(r, EngineCrashed) for r in results)
    assert engine.stats.ooms == 1 and engine.load().state == "restarting"
    assert engine.load().kv_cache_usage == 0
    ready_in = engine.load().ready_in_s
    assert ready_in is not None and 0 < ready_in <= 0.2
    with pytest.raises(EngineUnavailable):
        await collect(engine.generate(request("during")))
    await until(lambda: engine.load().state == "ready")
    assert engine.stats.restarts == 1
    assert engine.load().capacity_factor < 1.0  # slow start
    await asyncio.sleep(FAST.slow_start_s)
    assert engine.load().capacity_factor == 1.0
    assert (await collect(engine.generate(request("after"))))[-1].output_tokens == 5


async def test_crash_soon_after_restart_is_a_restart_loop(engine: SimEngine) -> None:
    assert engine.faults is not None
    engine.faults.request_crash()
    await until(lambda: engine.stats.restarts == 1 and engine.load().state == "ready")
    assert engine.stats.oom_restart_loops == 0
    engine.faults.request_crash()
    await until(lambda: engine.stats.restarts == 2 and engine.load().state == "ready")
    assert engine.stats.crashes == 2 and engine.stats.oom_restart_loops == 1


async def test_preempt_mode_survives_the_same_overload() -> None:
    sim = SimEngine(FAST, FaultState(oom_crash=False))
    await sim.start()
    try:
        streams = [
            sim.generate(request(f"p{i}", prompt_tokens=100, max_tokens=50)) for i in range(3)
        ]
        results = await asyncio.gather(*(collect(s) for s in streams))
        assert all(r[-1].output_tokens == 50 for r in results)
        assert sim.stats.ooms == 0 and sim.stats.preemptions >= 1
    finally:
        await sim.stop()


async def test_injected_errors_and_stall() -> None:
    faults = FaultState(oom_crash=True)
    sim = SimEngine(FAST, faults)
    await sim.start()
    try:
        faults.set_error_rate(1.0)
        with pytest.raises(InjectedError):
            await collect(sim.generate(request("e")))
        faults.set_error_rate(0.0)
        faults.stall(0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await collect(sim.generate(request("stalled", max_tokens=1)))
        assert loop.time() - started >= 0.15
    finally:
        await sim.stop()


# Room for four long sequences at once (no OOM): 128 blocks x 16 = 2048 slots.
ROOMY = dataclasses.replace(FAST, num_kv_blocks=128)


class ManualClock:
    """The engine's clock, moved by the test: deadlines pass when it says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_running_request_past_its_deadline_is_aborted_at_the_next_step() -> None:
    clock = ManualClock()
    sim = SimEngine(ROOMY, clock=clock)
    await sim.start()
    try:
        deltas = sim.generate(request("late", max_tokens=240, timeout_s=2.0))
        await deltas.__anext__()
        assert sim.load().running == 1 and sim.load().kv_cache_usage > 0
        clock.now += 1.9
        await deltas.__anext__()  # still inside its deadline: it goes on
        clock.now += 0.1
        with pytest.raises(DeadlineExceeded) as exceeded:
            async for _ in deltas:
                pass
        # Aborted, not finished: its blocks are free and it is counted as such.
        assert 2 <= exceeded.value.output_tokens < 240
        assert str(exceeded.value.output_tokens) in str(exceeded.value)
        assert sim.load().running == 0 and sim.load().kv_cache_usage == 0
        assert sim.stats.requests_deadline_exceeded == 1
        assert sim.stats.requests_aborted == 0 and sim.stats.requests_finished == 1  # probe
        on_time = await collect(sim.generate(request("on-time", max_tokens=5, timeout_s=1.0)))
        assert on_time[-1].output_tokens == 5
    finally:
        await sim.stop()


async def test_a_request_waiting_in_the_engine_past_its_deadline_never_runs() -> None:
    clock = ManualClock()
    sim = SimEngine(ROOMY, clock=clock)  # a batch of at most 4 sequences
    await sim.start()
    try:
        batch = [sim.generate(request(f"r{i}", max_tokens=240)) for i in range(4)]
        for deltas in batch:
            await deltas.__anext__()
        queued = sim.generate(request("queued", max_tokens=5, timeout_s=1.0))
        waiting = asyncio.ensure_future(collect(queued))
        await until(lambda: sim.load().waiting == 1)
        clock.now += 1.0
        with pytest.raises(DeadlineExceeded) as exceeded:
            await waiting
        assert exceeded.value.output_tokens == 0
        assert sim.load().waiting == 0 and sim.load().running == 4
        assert sim.stats.requests_deadline_exceeded == 1
        for deltas in batch:
            await deltas.aclose()  # type: ignore[attr-defined]
    finally:
        await sim.stop()
