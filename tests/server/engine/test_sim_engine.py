"""The sim engine's loop on a real event loop, on a fake clock: steps, restarts,
warm-up, slow start, stalls and deadlines take virtual time only, so a busy machine
cannot make them late and no test waits for them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from stormguard_server.config import SimEngineConfig
from stormguard_server.engine.base import (
    DeadlineExceeded,
    EngineCrashed,
    EngineUnavailable,
    GenerationRequest,
    InjectedError,
    TokenDelta,
)
from stormguard_server.engine.faults import FaultState
from stormguard_server.engine.sim_engine import HANG_LIMIT_S, SimEngine
from tests.server.fake_clock import FakeClock

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
        **{"ignore_eos": True, **kw},  # type: ignore[arg-type]
    )


async def collect(deltas: AsyncIterator[TokenDelta]) -> list[TokenDelta]:
    return [d async for d in deltas]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def started(config: SimEngineConfig, clock: FakeClock, **kw: object) -> SimEngine:
    sim = SimEngine(config, clock=clock, **kw)  # type: ignore[arg-type]
    await clock.drive(sim.start())  # the warm-up probe runs on the clock
    return sim


@pytest.fixture
async def engine(clock: FakeClock) -> AsyncIterator[SimEngine]:
    sim = await started(FAST, clock)
    yield sim
    await sim.stop()


async def test_generates_exactly_max_tokens_deterministically(
    engine: SimEngine, clock: FakeClock
) -> None:
    one = await clock.drive(collect(engine.generate(request("a", max_tokens=6))))
    assert one[-1].finish_reason == "length" and one[-1].output_tokens == 6
    two = await clock.drive(collect(engine.generate(request("b", max_tokens=6))))
    assert "".join(d.text for d in one) != "".join(d.text for d in two)  # per-prompt text
    again = await clock.drive(collect(engine.generate(request("a", max_tokens=6))))
    assert "".join(d.text for d in one) == "".join(d.text for d in again)
    assert engine.stats.output_tokens >= 18
    assert engine.load().kv_cache_usage == 0


async def test_stop_string_ends_with_stop(engine: SimEngine, clock: FakeClock) -> None:
    deltas = await clock.drive(collect(engine.generate(request("s", max_tokens=10))))
    word = "".join(d.text for d in deltas).split()[2]
    stopped = await clock.drive(collect(engine.generate(request("s", max_tokens=10, stop=(word,)))))
    assert stopped[-1].finish_reason == "stop"
    assert word not in "".join(d.text for d in stopped)


SCRIPT = ('{"', "city", '":', ' "', "Paris", '"}')


@pytest.mark.parametrize("ignore_eos", [True, False])
async def test_a_scripted_output_is_emitted_token_by_token_and_ends_with_stop(
    engine: SimEngine, clock: FakeClock, ignore_eos: bool
) -> None:
    """A decided answer (a JSON document, tool-call arguments) comes out one token a step,
    in order, and its last token is the end: ``stop``, even when it fills max_tokens
    exactly and whatever ignore_eos says."""
    for max_tokens in (len(SCRIPT), 50):
        scripted = request("j", max_tokens=max_tokens, script=SCRIPT, ignore_eos=ignore_eos)
        deltas = await clock.drive(collect(engine.generate(scripted)))
        assert [d.text for d in deltas] == list(SCRIPT)
        assert [d.output_tokens for d in deltas] == list(range(1, len(SCRIPT) + 1))
        assert deltas[-1].finish_reason == "stop"


async def test_a_scripted_output_cut_by_max_tokens_ends_with_length(
    engine: SimEngine, clock: FakeClock
) -> None:
    deltas = await clock.drive(collect(engine.generate(request("j", max_tokens=3, script=SCRIPT))))
    assert "".join(d.text for d in deltas) == "".join(SCRIPT[:3])
    assert deltas[-1].finish_reason == "length" and deltas[-1].output_tokens == 3


async def test_abort_takes_effect_within_a_step(engine: SimEngine, clock: FakeClock) -> None:
    deltas = engine.generate(request("long", max_tokens=200))
    await clock.drive(deltas.__anext__())
    produced = engine.stats.output_tokens
    engine.abort("long")
    await clock.run_until(lambda: engine.stats.requests_aborted == 1)
    assert engine.load().running == 0 and engine.load().kv_cache_usage == 0
    assert engine.stats.output_tokens <= produced + 1  # at most the step under way


async def test_closing_the_stream_aborts(engine: SimEngine, clock: FakeClock) -> None:
    deltas = engine.generate(request("closed", max_tokens=200))
    await clock.drive(deltas.__anext__())
    await deltas.aclose()  # type: ignore[attr-defined]
    await clock.run_until(lambda: engine.stats.requests_aborted == 1)
    assert engine.load().running == 0 and engine.stats.output_tokens < 200


async def test_oom_fails_running_and_waiting_then_cold_restart_and_ramp(
    engine: SimEngine, clock: FakeClock
) -> None:
    # 16 blocks x 16 = 256 slots; three 100-token prompts cannot all fit: OOM.
    streams = [
        engine.generate(request(f"r{i}", prompt_tokens=100, max_tokens=50)) for i in range(3)
    ]
    gathered = asyncio.gather(*(collect(s) for s in streams), return_exceptions=True)
    results = await clock.drive(gathered)
    assert all(isinstance(r, EngineCrashed) for r in results)
    assert engine.stats.ooms == 1 and engine.load().state == "restarting"
    assert engine.load().kv_cache_usage == 0
    crashed_at = clock.now()
    ready_in = engine.load().ready_in_s
    assert ready_in is not None and FAST.restart_s < ready_in <= 0.2
    with pytest.raises(EngineUnavailable):
        await collect(engine.generate(request("during")))
    await clock.advance(FAST.restart_s / 2)
    assert engine.load().state == "restarting"  # cold for restart_s
    await clock.run_until(lambda: engine.load().state == "ready")
    assert clock.now() - crashed_at == pytest.approx(ready_in, abs=2 * FAST.step_base_s)
    assert engine.stats.restarts == 1
    ramp = engine.load().capacity_factor
    assert FAST.slow_start_floor <= ramp < 1.0  # slow start
    await clock.advance(FAST.slow_start_s / 2)
    assert ramp < engine.load().capacity_factor < 1.0
    await clock.advance(FAST.slow_start_s / 2)
    assert engine.load().capacity_factor == 1.0
    after = await clock.drive(collect(engine.generate(request("after"))))
    assert after[-1].output_tokens == 5


async def test_crash_soon_after_restart_is_a_restart_loop(
    engine: SimEngine, clock: FakeClock
) -> None:
    engine.faults.request_crash()
    await clock.run_until(lambda: engine.stats.restarts == 1 and engine.load().state == "ready")
    assert engine.stats.oom_restart_loops == 0
    engine.faults.request_crash()
    await clock.run_until(lambda: engine.stats.restarts == 2 and engine.load().state == "ready")
    assert engine.stats.crashes == 2 and engine.stats.oom_restart_loops == 1
    # Past the restart-loop period, a crash is a crash again, not a loop.
    await clock.advance(FAST.restart_loop_period_s)
    engine.faults.request_crash()
    await clock.run_until(lambda: engine.stats.restarts == 3 and engine.load().state == "ready")
    assert engine.stats.crashes == 3 and engine.stats.oom_restart_loops == 1


async def test_preempt_mode_survives_the_same_overload(clock: FakeClock) -> None:
    sim = await started(FAST, clock, faults=FaultState(oom_crash=False, clock=clock))
    try:
        streams = [
            sim.generate(request(f"p{i}", prompt_tokens=100, max_tokens=50)) for i in range(3)
        ]
        results = await clock.drive(asyncio.gather(*(collect(s) for s in streams)))
        assert all(r[-1].output_tokens == 50 for r in results)
        assert sim.stats.ooms == 0 and sim.stats.preemptions >= 1
    finally:
        await sim.stop()


async def test_injected_errors_added_latency_and_stall(clock: FakeClock) -> None:
    faults = FaultState(oom_crash=True, clock=clock)
    sim = await started(FAST, clock, faults=faults)
    try:
        faults.set_error_rate(1.0)
        with pytest.raises(InjectedError):
            await collect(sim.generate(request("e")))
        faults.set_error_rate(0.0)
        step = FAST.step_base_s
        start = clock.now()
        await clock.drive(collect(sim.generate(request("quick", max_tokens=1))))
        quick = clock.now() - start
        assert quick < 10 * step
        faults.set_added_latency(0.5)
        start = clock.now()
        await clock.drive(collect(sim.generate(request("late", max_tokens=1))))
        assert clock.now() - start == pytest.approx(0.5 + quick)
        faults.set_added_latency(0.0)
        faults.stall(2.0)
        start = clock.now()
        await clock.drive(collect(sim.generate(request("stalled", max_tokens=1))))
        assert 2.0 <= clock.now() - start < 2.0 + 0.05 + quick  # the stall, polled
    finally:
        await sim.stop()


async def test_a_hung_request_answers_nothing_until_its_deadline_or_the_limit(
    clock: FakeClock,
) -> None:
    faults = FaultState(oom_crash=True, clock=clock)
    sim = await started(FAST, clock, faults=faults)
    try:
        faults.set_hang_rate(1.0)
        start = clock.now()
        with pytest.raises(DeadlineExceeded):
            await clock.drive(collect(sim.generate(request("held", timeout_s=2.0))))
        assert clock.now() - start == pytest.approx(2.0)
        assert sim.load().running == 0 and sim.load().kv_cache_usage == 0  # held outside
        start = clock.now()
        with pytest.raises(InjectedError, match="hang"):
            await clock.drive(collect(sim.generate(request("no-deadline"))))
        assert clock.now() - start == pytest.approx(HANG_LIMIT_S)
        faults.set_hang_rate(0.0)
        await clock.drive(collect(sim.generate(request("served", max_tokens=1))))
    finally:
        await sim.stop()


# Room for four long sequences at once (no OOM): 128 blocks x 16 = 2048 slots.
ROOMY = dataclasses.replace(FAST, num_kv_blocks=128)


async def test_a_running_request_past_its_deadline_is_aborted_at_the_next_step(
    clock: FakeClock,
) -> None:
    # Steps of 10 ms: 240 tokens take 2.4 s, past the 2 s deadline.
    sim = await started(dataclasses.replace(ROOMY, step_base_s=0.01), clock)
    try:
        start = clock.now()
        deltas = sim.generate(request("late", max_tokens=240, timeout_s=2.0))
        await clock.drive(deltas.__anext__())
        assert sim.load().running == 1 and sim.load().kv_cache_usage > 0
        with pytest.raises(DeadlineExceeded) as exceeded:
            await clock.drive(collect(deltas))
        assert clock.now() - start == pytest.approx(2.0, abs=0.011)  # at the next step
        # Aborted, not finished: its blocks are free and it is counted as such.
        assert 2 <= exceeded.value.output_tokens < 240
        assert str(exceeded.value.output_tokens) in str(exceeded.value)
        assert sim.load().running == 0 and sim.load().kv_cache_usage == 0
        assert sim.stats.requests_deadline_exceeded == 1
        assert sim.stats.requests_aborted == 0 and sim.stats.requests_finished == 1  # probe
        on_time = await clock.drive(
            collect(sim.generate(request("on-time", max_tokens=5, timeout_s=1.0)))
        )
        assert on_time[-1].output_tokens == 5
    finally:
        await sim.stop()


async def test_a_request_waiting_in_the_engine_past_its_deadline_never_runs(
    clock: FakeClock,
) -> None:
    # A batch of at most 4 sequences, each 240 tokens of 10 ms steps (2.4 s).
    sim = await started(dataclasses.replace(ROOMY, step_base_s=0.01), clock)
    try:
        batch = [sim.generate(request(f"r{i}", max_tokens=240)) for i in range(4)]
        for deltas in batch:
            await clock.drive(deltas.__anext__())
        queued = sim.generate(request("queued", max_tokens=5, timeout_s=1.0))
        waiting = asyncio.ensure_future(collect(queued))
        await clock.run_until(lambda: sim.load().waiting == 1)
        start = clock.now()
        with pytest.raises(DeadlineExceeded) as exceeded:
            await clock.drive(waiting)
        assert clock.now() - start == pytest.approx(1.0, abs=0.011)
        assert exceeded.value.output_tokens == 0
        assert sim.load().waiting == 0 and sim.load().running == 4
        assert sim.stats.requests_deadline_exceeded == 1
        for deltas in batch:
            await deltas.aclose()  # type: ignore[attr-defined]
    finally:
        await sim.stop()
