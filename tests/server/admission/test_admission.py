"""Admission decisions with an injected clock and a fake engine load: no sleeping."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from stormguard.protocol import Priority, ShedReason
from stormguard_server.admission.controller import AdmissionController
from stormguard_server.admission.tickets import Grant, Shed, ShedError, Ticket
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine.base import EngineLoad
from tests.server.fake_clock import FakeClock as ServerFakeClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    def __init__(self) -> None:
        self.current = EngineLoad(
            state="ready", kv_cache_usage=0.25, kv_capacity_tokens=1000, running=0, waiting=0
        )

    def __call__(self) -> EngineLoad:
        return self.current


def make(**overrides: object) -> tuple[AdmissionController, FakeClock, FakeEngine]:
    settings: dict[str, object] = {
        "kv_watermark": 1.0,
        "max_queue_requests": 3,
        "max_queue_tokens": 10_000,
        "max_queue_wait_s": 5.0,
        "retry_queue_fraction": 1.0,
        **overrides,
    }
    config = AdmissionConfig(**settings)  # type: ignore[arg-type]
    clock, engine = FakeClock(), FakeEngine()
    return AdmissionController(config, engine, clock=clock), clock, engine


def ticket(
    ctl: AdmissionController,
    cost: int,
    priority: Priority = Priority.STANDARD,
    attempt: int = 1,
    deadline_ms: float | None = None,
) -> Ticket:
    return ctl.make_ticket(cost, priority=priority, attempt=attempt, deadline_ms=deadline_ms)


def admitted(decision: Grant | Shed | None) -> Grant:
    assert isinstance(decision, Grant), decision
    return decision


def shed(decision: Grant | Shed | None) -> Shed:
    assert isinstance(decision, Shed), decision
    return decision


def error_of(t: Ticket) -> Shed:
    assert t.future is not None and t.future.done()
    exc = t.future.exception()
    assert isinstance(exc, ShedError)
    return exc.shed


async def test_admits_while_cost_fits_the_budget_then_queues() -> None:
    ctl, _, _ = make()
    first = admitted(ctl.submit(ticket(ctl, 600)))
    assert ctl.inflight_tokens == 600
    queued = ticket(ctl, 500)
    assert ctl.submit(queued) is None
    assert ctl.queue_depth == 1 and ctl.queue_tokens == 500
    load = ctl.server_load()
    assert (load.queue_depth, load.queue_tokens, load.inflight_tokens) == (1, 500, 600)
    assert load.token_capacity == 1000 and load.kv_cache_usage == 0.25
    ctl.release(first)
    assert queued.future is not None and queued.future.done()
    assert ctl.inflight_tokens == 500 and ctl.queue_depth == 0
    ctl.release(first)  # releasing twice is harmless
    assert ctl.inflight_tokens == 500


async def test_budget_is_kv_capacity_times_watermark_and_scaled_in_slow_start() -> None:
    ctl, _, engine = make(kv_watermark=0.8)
    assert ctl.budget() == 800
    engine.current = replace(engine.current, capacity_factor=0.5)
    assert ctl.budget() == 400 and ctl.full_budget() == 800


async def test_too_long_is_a_400_that_must_not_be_retried() -> None:
    ctl, _, _ = make()
    refusal = shed(ctl.submit(ticket(ctl, 1001)))
    assert refusal.reason is ShedReason.TOO_LONG
    assert refusal.status_code == 400 and refusal.should_retry is False
    assert refusal.retry_after_s is None


async def test_queue_serves_by_priority_then_arrival() -> None:
    ctl, _, _ = make(max_queue_requests=10)
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    order = [
        ticket(ctl, 100, Priority.SHEDDABLE),
        ticket(ctl, 100, Priority.STANDARD),
        ticket(ctl, 100, Priority.CRITICAL),
        ticket(ctl, 100, Priority.STANDARD),
    ]
    for t in order:
        assert ctl.submit(t) is None
    ctl.release(holder)
    served = [t for t in order if t.future is not None and t.future.done()]
    assert served == order  # all fit once the holder is gone
    assert [t.priority for t in sorted(order, key=lambda t: t.order_key)] == [
        Priority.CRITICAL,
        Priority.STANDARD,
        Priority.STANDARD,
        Priority.SHEDDABLE,
    ]


async def test_head_of_line_is_not_overtaken_by_smaller_requests() -> None:
    ctl, _, _ = make()
    holder = admitted(ctl.submit(ticket(ctl, 600)))
    big, small = ticket(ctl, 900), ticket(ctl, 10)
    assert ctl.submit(big) is None
    assert ctl.submit(small) is None  # it would fit, but the big one is ahead
    ctl.release(holder)
    assert big.future is not None and big.future.done()
    assert small.future is not None and small.future.done()


async def test_full_queue_sheds_sheddable_before_standard_before_critical() -> None:
    ctl, _, _ = make()
    admitted(ctl.submit(ticket(ctl, 1000)))
    sheddable = ticket(ctl, 10, Priority.SHEDDABLE)
    standard = ticket(ctl, 10, Priority.STANDARD)
    critical = ticket(ctl, 10, Priority.CRITICAL)
    for t in (sheddable, standard, critical):
        assert ctl.submit(t) is None
    newcomer = ticket(ctl, 10, Priority.STANDARD)
    assert ctl.submit(newcomer) is None
    assert error_of(sheddable).reason is ShedReason.QUEUE_FULL
    assert error_of(sheddable).should_retry is True
    # The queue now holds standard, critical, newcomer: a sheddable newcomer is shed itself.
    late = shed(ctl.submit(ticket(ctl, 10, Priority.SHEDDABLE)))
    assert late.reason is ShedReason.QUEUE_FULL and late.status_code == 503
    # A critical newcomer evicts the newest standard one.
    vip = ticket(ctl, 10, Priority.CRITICAL)
    assert ctl.submit(vip) is None
    assert error_of(newcomer).reason is ShedReason.QUEUE_FULL
    assert standard.future is not None and not standard.future.done()


async def test_retries_are_shed_before_first_attempts_and_told_not_to_retry() -> None:
    ctl, _, _ = make()
    admitted(ctl.submit(ticket(ctl, 1000)))
    first = ticket(ctl, 10)
    retry = ticket(ctl, 10, attempt=3)
    other = ticket(ctl, 10)
    for t in (retry, first, other):
        assert ctl.submit(t) is None
    assert ctl.submit(ticket(ctl, 10)) is None
    refusal = error_of(retry)
    assert refusal.reason is ShedReason.RETRY_SHED
    assert refusal.should_retry is False
    assert refusal.retry_after_s is not None
    late_retry = shed(ctl.submit(ticket(ctl, 10, attempt=2)))
    assert late_retry.reason is ShedReason.RETRY_SHED and late_retry.should_retry is False


async def test_retry_behind_a_long_queue_is_shed_at_once() -> None:
    ctl, _, _ = make(max_queue_requests=4, retry_queue_fraction=0.5)
    admitted(ctl.submit(ticket(ctl, 1000)))
    for _ in range(2):
        assert ctl.submit(ticket(ctl, 10)) is None
    refusal = shed(ctl.submit(ticket(ctl, 10, attempt=2)))
    assert refusal.reason is ShedReason.RETRY_SHED
    assert ctl.submit(ticket(ctl, 10, attempt=1)) is None  # a first attempt still queues


async def test_token_limit_of_the_queue() -> None:
    ctl, _, _ = make(max_queue_tokens=100, max_queue_requests=10)
    admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 80)) is None
    refusal = shed(ctl.submit(ticket(ctl, 30)))
    assert refusal.reason is ShedReason.TOKEN_BUDGET


def measure_holds(ctl: AdmissionController, clock: FakeClock, cost: int, held_s: float) -> None:
    """Four requests of ``cost`` tokens, one after the other, each held ``held_s``."""
    for _ in range(4):
        grant = admitted(ctl.submit(ticket(ctl, cost)))
        clock.now += held_s
        ctl.release(grant)


async def test_retry_after_comes_from_how_long_requests_hold_their_tokens() -> None:
    ctl, clock, _ = make(max_queue_requests=1)
    measure_holds(ctl, clock, 250, 0.5)  # 0.002 s per token (no max_tokens: the cost)
    model = ctl.holds.model()
    assert model is not None and model.hold_s(1000, 0) == pytest.approx(2.0)
    assert ctl.holds.mean_hold_s() == pytest.approx(0.5)
    admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 400)) is None
    refusal = shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE)))
    # 400 queued + 600 of its own need the holder's 1000 back: it holds them 2 s.
    assert refusal.retry_after_s == pytest.approx(2.0)


async def test_retry_after_counts_down_as_the_running_work_nears_its_end() -> None:
    ctl, clock, _ = make(max_queue_requests=1)
    measure_holds(ctl, clock, 250, 0.5)
    admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 400)) is None
    retry_afters = []
    for _ in range(3):
        retry_afters.append(shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE))).retry_after_s)
        clock.now += 0.75
    # A drain rate alone said 2 s each time: it saw the past releases, not that the
    # one running request had been at it for 0.75 s, then 1.5 s.
    assert retry_afters == pytest.approx([2.0, 1.25, 0.5])
    clock.now += 1.0  # overdue: expected back any moment, the shortest Retry-After
    assert shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE))).retry_after_s == 0.05


async def test_a_batch_that_just_started_frees_nothing_before_its_hold() -> None:
    ctl, clock, _ = make(max_queue_requests=1)
    measure_holds(ctl, clock, 500, 1.0)  # 0.002 s per token: 500 tokens hold 1 s
    old = admitted(ctl.submit(ticket(ctl, 500)))
    clock.now += 0.9
    admitted(ctl.submit(ticket(ctl, 500)))
    assert ctl.submit(ticket(ctl, 400)) is None
    nearly_done = shed(ctl.submit(ticket(ctl, 100, Priority.SHEDDABLE)))
    assert nearly_done.retry_after_s == pytest.approx(0.1)  # the old one's 500 suffice
    just_started = shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE)))
    assert just_started.retry_after_s == pytest.approx(1.0)  # the new one's are needed too
    ctl.release(old)


async def test_a_wait_beyond_the_running_work_counts_whole_turnovers() -> None:
    ctl, clock, _ = make(max_queue_requests=1)
    measure_holds(ctl, clock, 1000, 2.0)  # a full budget turns over every 2 s
    admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 1000)) is None
    refusal = shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE)))
    # The holder's 1000 come back in 2 s and go to the queued 1000, which hold
    # them 2 s more: 4 s, for 1600 tokens of work ahead and its own.
    assert refusal.retry_after_s == pytest.approx(4.0)


async def test_a_long_prompt_is_not_taken_for_a_long_hold() -> None:
    ctl, clock, _ = make(max_queue_requests=1)
    for prompt, held_s in ((50, 1.0), (850, 1.08)) * 4:  # decoding 100 tokens dominates
        grant = admitted(ctl.submit(ctl.make_ticket(prompt + 100, max_tokens=100)))
        clock.now += held_s
        ctl.release(grant)
    model = ctl.holds.model()
    assert model is not None
    assert model.hold_s(50, 100) == pytest.approx(1.0)
    assert model.hold_s(850, 100) == pytest.approx(1.08)
    admitted(ctl.submit(ctl.make_ticket(1000, max_tokens=100)))  # the whole budget
    assert ctl.submit(ticket(ctl, 10)) is None
    refusal = shed(ctl.submit(ticket(ctl, 10, Priority.SHEDDABLE)))
    assert refusal.retry_after_s == pytest.approx(1.085)  # not 1000/150 x 1 s


async def test_retry_after_right_after_a_restart_is_what_it_was_before() -> None:
    ctl, clock, engine = make(max_queue_requests=1)
    measure_holds(ctl, clock, 250, 0.5)
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 400)) is None
    before = shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE))).retry_after_s
    # The engine crashes: the holder fails (not a hold worth measuring) and the
    # queue is shed; a cold restart takes far longer than the measuring window.
    clock.now += 0.01
    engine.current = replace(engine.current, state="restarting", ready_in_s=30.0)
    ctl.tick()
    ctl.release(holder, served=False)
    clock.now += 30.0
    engine.current = replace(engine.current, state="ready", ready_in_s=None)
    admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 400)) is None
    after = shed(ctl.submit(ticket(ctl, 600, Priority.SHEDDABLE))).retry_after_s
    # A drain rate over the last seconds had nothing left after the downtime (the
    # 1 s fallback), or, with a shorter restart, a rate diluted by it.
    assert after == before == pytest.approx(2.0)


async def test_retry_after_before_any_measurement_is_a_bounded_fallback() -> None:
    ctl, _, _ = make(max_queue_requests=1)
    admitted(ctl.submit(ticket(ctl, 1000)))
    assert ctl.submit(ticket(ctl, 10)) is None
    refusal = shed(ctl.submit(ticket(ctl, 10, Priority.SHEDDABLE)))
    assert refusal.retry_after_s == 1.0


async def test_deadline_zero_or_unmeetable_is_refused_at_once() -> None:
    ctl, clock, _ = make()
    zero = shed(ctl.submit(ticket(ctl, 10, deadline_ms=0)))
    assert zero.reason is ShedReason.DEADLINE and zero.should_retry is False
    for _ in range(2):  # 0.01 s per token
        grant = admitted(ctl.submit(ticket(ctl, 100)))
        clock.now += 1.0
        ctl.release(grant)
    admitted(ctl.submit(ticket(ctl, 1000)))
    # Needs the holder's tokens back: it holds them 10 s; the caller waits 1 s.
    hopeless = shed(ctl.submit(ticket(ctl, 500, deadline_ms=1000)))
    assert hopeless.reason is ShedReason.DEADLINE
    assert "10.00 s" in hopeless.message
    assert ctl.queue_depth == 0
    assert ctl.submit(ticket(ctl, 500, deadline_ms=20_000)) is None


async def test_expired_while_queued_never_runs() -> None:
    ctl, clock, _ = make()
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    short = ticket(ctl, 10, deadline_ms=300)
    patient = ticket(ctl, 10)
    assert ctl.submit(short) is None and ctl.submit(patient) is None
    clock.now += 0.3
    assert ctl.expire() == [short]
    assert error_of(short).reason is ShedReason.DEADLINE
    clock.now += 5.0  # the queue's own maximum wait
    assert ctl.expire() == [patient]
    assert error_of(patient).reason is ShedReason.DEADLINE
    assert error_of(patient).should_retry is True
    ctl.release(holder)
    assert ctl.inflight_tokens == 0


async def test_cancelled_while_queued_leaves_the_queue() -> None:
    ctl, _, _ = make()
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    gone = ticket(ctl, 10)
    assert ctl.submit(gone) is None
    assert ctl.cancel(gone) is True
    assert ctl.queue_depth == 0 and ctl.queue_tokens == 0
    ctl.release(holder)
    assert ctl.inflight_tokens == 0
    assert ctl.cancel(gone) is False


async def test_engine_down_sheds_with_restart_reason_and_ready_time() -> None:
    ctl, _, engine = make()
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    queued = ticket(ctl, 10)
    assert ctl.submit(queued) is None
    engine.current = replace(engine.current, state="restarting", ready_in_s=2.5)
    ctl.tick()
    assert error_of(queued).reason is ShedReason.ENGINE_RESTART
    assert error_of(queued).retry_after_s == 2.5
    refusal = shed(ctl.submit(ticket(ctl, 10)))
    assert refusal.reason is ShedReason.ENGINE_RESTART and refusal.should_retry is True
    engine.current = replace(engine.current, state="warming", ready_in_s=0.01)
    warming = shed(ctl.submit(ticket(ctl, 10)))
    assert warming.reason is ShedReason.WARMING
    assert warming.retry_after_s == 0.05  # clamped to the minimum
    ctl.release(holder)


async def test_idle_engine_takes_a_large_request_during_slow_start() -> None:
    ctl, _, engine = make()
    engine.current = replace(engine.current, capacity_factor=0.25)
    admitted(ctl.submit(ticket(ctl, 900)))  # over the ramped budget, but nothing runs
    assert ctl.submit(ticket(ctl, 10)) is None


async def test_acquire_waits_and_cancellation_cleans_up() -> None:
    ctl, _, _ = make()
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    waiting = ticket(ctl, 10)
    task = asyncio.create_task(ctl.acquire(waiting))
    await asyncio.sleep(0)
    assert ctl.queue_depth == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ctl.queue_depth == 0
    served = asyncio.create_task(ctl.acquire(ticket(ctl, 10)))
    await asyncio.sleep(0)
    ctl.release(holder)
    grant = await served
    assert grant.ticket.cost == 10
    with pytest.raises(ShedError):
        await ctl.acquire(ticket(ctl, 5000))


async def test_queue_position_is_recorded() -> None:
    ctl, _, _ = make(max_queue_requests=10)
    admitted(ctl.submit(ticket(ctl, 1000)))
    later, urgent = ticket(ctl, 10), ticket(ctl, 10, Priority.CRITICAL)
    assert ctl.submit(later) is None and ctl.submit(urgent) is None
    assert (later.queue_position, urgent.queue_position) == (0, 0)
    assert [t.queue_position for t in (ticket(ctl, 10),) if ctl.submit(t) is None] == [2]


async def test_cost_is_counted_in_whole_kv_blocks() -> None:
    ctl, _, engine = make()
    engine.current = replace(engine.current, kv_block_size=16)
    assert ticket(ctl, 17).cost == 32
    assert ticket(ctl, 16).cost == 16
    # 62 one-token requests take 62 blocks = 992 slots: the 63rd does not fit in 1000.
    for _ in range(62):
        admitted(ctl.submit(ticket(ctl, 1)))
    assert ctl.submit(ticket(ctl, 1)) is None


async def test_a_queued_acquire_gives_up_at_its_wait_limit_on_the_servers_clock() -> None:
    clock = ServerFakeClock()
    config = AdmissionConfig(kv_watermark=1.0, max_queue_wait_s=5.0)
    ctl = AdmissionController(config, FakeEngine(), clock=clock)
    holder = admitted(ctl.submit(ticket(ctl, 1000)))
    patient, hurried = ticket(ctl, 10), ticket(ctl, 10, deadline_ms=1500)
    start = clock.now()
    both = asyncio.gather(ctl.acquire(patient), ctl.acquire(hurried), return_exceptions=True)
    # Nothing ticks: each acquire's own timed wait on the clock sheds it.
    sheds = await clock.drive(both)
    assert all(isinstance(s, ShedError) for s in sheds)
    assert clock.now() - start == pytest.approx(5.0)
    assert error_of(hurried).reason is ShedReason.DEADLINE
    assert error_of(hurried).should_retry is False  # its caller's deadline passed
    assert error_of(patient).should_retry is True  # the queue's limit: worth another try
    assert ctl.queue_depth == 0
    ctl.release(holder)
