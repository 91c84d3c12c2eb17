"""The adaptive concurrency limit on its own: AIMD, the local queue, deadlines."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import ConcurrencyLimiter, LocalQueueFullError, QueueTimeoutError, ServerLoad
from stormguard._core.exceptions import APITimeoutError, RateLimitError, ServiceUnavailableError
from stormguard._core.verdict import LimitOutcome
from stormguard._policies.limiter.aimd import MAX_PAUSE_S
from stormguard._policies.limiter.endpoint_limit import EndpointLimit
from stormguard._policies.limiter.lease import Lease
from stormguard._policies.limiter.limiter import limit_outcome
from stormguard._policies.limiter.slot_waiter import SlotWaiter
from stormguard.testing import FakeClock

E = "gpu-1:8000"
FAR = 1e9  # a deadline that never matters


def limiter(clock: FakeClock | None = None, **kwargs: object) -> ConcurrencyLimiter:
    return ConcurrencyLimiter(clock=clock or FakeClock(), **kwargs)  # type: ignore[arg-type]


def take(limit: EndpointLimit, rank: int = 1, seq: int = 0, deadline: float = FAR) -> Lease:
    got = limit.acquire(rank, seq, deadline)
    assert isinstance(got, Lease), "expected a slot at once"
    return got


def finish(lease: Lease, outcome: LimitOutcome, **load: object) -> None:
    lease.mark(outcome, ServerLoad(**load) if load else None)  # type: ignore[arg-type]
    lease.release()


_ROUND_SEQ = itertools.count(1_000_000)


def full_round(limit: EndpointLimit) -> None:
    """One round trip with the whole limit in use, every call a success."""
    batch = [take(limit, seq=next(_ROUND_SEQ)) for _ in range(limit.state().limit)]
    for lease in batch:
        finish(lease, LimitOutcome.SUCCESS)


def slow_start_back(limit: EndpointLimit) -> None:
    """Full rounds of successes until slow start ends."""
    while limit.state().slow_start:
        full_round(limit)


# -- AIMD -------------------------------------------------------------------------------


def test_slow_start_adds_one_per_success_while_the_limit_is_in_use() -> None:
    limit = limiter(initial_limit=4).endpoint(E)
    leases = [take(limit, seq=i) for i in range(4)]  # sent with 1, 2, 3, 4 in flight
    for lease in leases:
        finish(lease, LimitOutcome.SUCCESS)
    # The first was sent with 1 of 4 in flight (1 * 2 < 4: not in use); the others grow it.
    assert limit.state().limit == 7 and limit.state().slow_start


def test_an_idle_limit_does_not_grow() -> None:
    limit = limiter(initial_limit=10).endpoint(E)
    for i in range(50):  # one call at a time: 1 * 2 < 10, the limit is not in use
        finish(take(limit, seq=i), LimitOutcome.SUCCESS)
    assert limit.state().limit == 10


def test_a_drop_cuts_the_limit_once_per_round_trip_then_growth_is_linear() -> None:
    limit = limiter(initial_limit=20).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    for shed, served in zip(leases[:5], leases[5:10], strict=True):
        finish(shed, LimitOutcome.DROPPED)  # sheds of attempts sent under the same limit,
        finish(served, LimitOutcome.SUCCESS)  # amid successes: the server is just full
    state = limit.state()
    assert (state.limit, state.decreases, state.slow_start) == (18, 1, False)
    for lease in leases[10:]:  # 10 more successes, each sent with 20 in flight: + 1/limit
        finish(lease, LimitOutcome.SUCCESS)
    assert limit.state().limit == 18  # 18 + 15/18 < 19: one slot per round trip, not 15
    again = [take(limit, seq=100 + i) for i in range(18)]
    finish(again[0], LimitOutcome.DROPPED)  # sent after the cut: a new signal
    assert (limit.state().limit, limit.state().decreases) == (16, 2)


def test_drops_in_a_row_bring_the_limit_down_to_what_is_still_in_flight() -> None:
    limit = limiter(initial_limit=20).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    for lease in leases[:5]:  # five sheds back to back: the server holds the other 15
        finish(lease, LimitOutcome.DROPPED)
    state = limit.state()
    assert (state.limit, state.in_flight, state.paused_for) == (15, 15, 0.0)
    for lease in leases[5:]:
        finish(lease, LimitOutcome.SUCCESS)  # a success ends the run
    assert limit.state().limit == 15  # 15 + 15/15, taken in slow start's stead
    finish(take(limit, seq=50), LimitOutcome.DROPPED)  # a drop after a success, alone:
    assert limit.state().limit == 14  # 10 % off, not down to the 0 now in flight


def test_a_run_of_drops_that_empties_the_window_pauses_at_the_floor() -> None:
    """A crash cuts every stream in flight: one window of lost attempts, then the
    floor's pause and its probes, not a window of refused attempts per 10 % step."""
    clock = FakeClock()
    limit = limiter(clock, initial_limit=20).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    for lease in leases[-3:]:
        finish(lease, LimitOutcome.SUCCESS)  # served at a limit of 20 (slow start: now 23)
    refilled = [take(limit, seq=100 + i) for i in range(6)]
    sent = 26
    for lease in leases[:-3] + refilled:  # the engine dies: every attempt is lost
        finish(lease, LimitOutcome.DROPPED)
        while limit.has_room():  # whatever the limit lets out meanwhile is refused too
            sent += 1
            finish(take(limit, seq=200 + sent), LimitOutcome.DROPPED)
    state = limit.state()
    assert sent == 26  # nothing more went out while the run lasted
    assert state.limit == 1 and 0.125 <= state.paused_for <= 0.25
    pauses = []
    for i in range(3):  # each probe after a pause is refused too: the pause doubles
        clock.advance(limit.state().paused_for)
        finish(take(limit, seq=300 + i), LimitOutcome.DROPPED)
        pauses.append(limit.state().paused_for)
    assert pauses[-1] > 0.5
    clock.advance(pauses[-1])
    slow_start_back(limit)  # back: slow start towards half the limit it had
    assert 11 <= limit.state().limit <= 13


def test_cut_streams_bring_the_limit_down_like_drops_but_never_pause_the_endpoint() -> None:
    """A crash cuts every stream in flight: the limit follows them down to the
    floor as for sheds, but a cut is no refusal (the server took the call), so
    the endpoint is not paused; only a shed at the floor pauses it."""
    clock = FakeClock()
    limit = limiter(clock, initial_limit=20).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    finish(leases[0], LimitOutcome.SUCCESS)
    for lease in leases[1:]:
        finish(lease, LimitOutcome.CUT)
    state = limit.state()
    assert (state.limit, state.in_flight, state.paused_for) == (1, 0, 0.0)
    for i in range(5):  # one call at a time, each cut: never a pause
        finish(take(limit, seq=100 + i), LimitOutcome.CUT)
        assert (limit.state().limit, limit.state().paused_for) == (1, 0.0)
    finish(take(limit, seq=200), LimitOutcome.DROPPED)  # a shed at the floor pauses
    assert 0.125 <= limit.state().paused_for <= 0.25


def test_a_restart_drops_to_the_minimum_and_slow_starts_to_half_the_old_limit() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=20, min_limit=1).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    finish(leases[0], LimitOutcome.RESTARTING)
    finish(leases[1], LimitOutcome.RESTARTING)  # repeated: stays at the bottom
    assert (limit.state().limit, limit.state().slow_start) == (1, True)
    for lease in leases[2:]:
        lease.release()  # the rest ended without a verdict (IGNORED)
    clock.advance(1.0)  # no Retry-After: the default pause
    for i in range(12):  # one at a time: in use (1 * 2 >= limit) only while it is small
        finish(take(limit, seq=100 + i), LimitOutcome.SUCCESS)
    state = limit.state()
    assert state.limit == 3 and state.slow_start  # 1 -> 2 -> 3, then no longer in use
    leases = [take(limit, seq=200 + i) for i in range(3)]
    for lease in leases:
        finish(lease, LimitOutcome.SUCCESS)
    assert limit.state().limit == 5  # doubling per round trip again, up to 10


def test_a_restart_pauses_the_endpoint_for_its_retry_after_then_one_probe_goes() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=8).endpoint(E)
    leases = [take(limit, seq=i) for i in range(8)]
    finish(leases[0], LimitOutcome.RESTARTING, retry_after=3.0)
    for lease in leases[1:]:
        lease.release()  # cut by the crash: no verdict
    state = limit.state()
    assert (state.limit, state.paused_for, state.in_flight) == (1, 3.0, 0)
    assert not limit.has_room()
    waiters = [limit.acquire(1, 10 + i, deadline_at=clock.now() + 30.0) for i in range(4)]
    assert all(isinstance(w, SlotWaiter) and not w.done for w in waiters)  # the queue holds
    with pytest.raises(QueueTimeoutError) as info:  # cannot outlast the pause: told at once
        limit.acquire(1, 20, deadline_at=clock.now() + 2.0)
    assert info.value.estimated_wait_s == pytest.approx(3.0)
    clock.advance(3.0)
    limit.poll()  # the pause is over: one probe, not the whole queue
    assert [w.done for w in waiters] == [True, False, False, False]  # type: ignore[union-attr]
    probe = waiters[0].wait(0)  # type: ignore[union-attr]
    finish(probe, LimitOutcome.SUCCESS)  # the server answers: slow start, 1 -> 2
    assert [w.done for w in waiters] == [True, True, True, False]  # type: ignore[union-attr]
    assert limit.state().limit == 2


def test_a_restart_amid_the_cut_streams_recovers_towards_the_limit_before_the_crash() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=20).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    finish(leases[-1], LimitOutcome.SUCCESS)  # served at 20
    for lease in leases[:12]:  # the crash cuts streams: the limit follows them down...
        finish(lease, LimitOutcome.DROPPED)
    assert limit.state().limit == 7
    finish(leases[12], LimitOutcome.RESTARTING, retry_after=1.0)  # ...then the restart sheds
    for lease in leases[13:19]:
        lease.release()
    clock.advance(1.0)
    slow_start_back(limit)
    assert 10 <= limit.state().limit <= 12  # half of 20, not of the 7 the cuts had left


async def test_a_waiter_sleeping_through_a_pause_wakes_when_it_ends() -> None:
    limit = ConcurrencyLimiter(initial_limit=4).endpoint(E)  # real time
    lease = take(limit)
    finish(lease, LimitOutcome.RESTARTING, retry_after=0.2)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    granted = await asyncio.wait_for(waiter.wait_async(None), 30)
    assert granted.queued_s >= 0.15  # nobody released anything: the pause's end woke it
    granted.release()


def test_a_thread_sleeping_through_a_pause_wakes_when_it_ends() -> None:
    limit = ConcurrencyLimiter(initial_limit=4).endpoint(E)  # real time
    finish(take(limit), LimitOutcome.RESTARTING, retry_after=0.2)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    granted = waiter.wait(30)
    assert granted.queued_s >= 0.15
    granted.release()


def test_sheds_at_the_floor_pause_the_endpoint_for_a_doubling_backoff() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=1, min_limit=1).endpoint(E)
    pauses = []
    for i in range(4):  # a plain 503 with no Retry-After, again and again
        finish(take(limit, seq=i), LimitOutcome.DROPPED)
        pauses.append(limit.state().paused_for)
        clock.advance(pauses[-1])
    assert 0.125 <= pauses[0] <= 0.25
    assert all(later >= earlier for earlier, later in itertools.pairwise(pauses))
    assert pauses[-1] <= 2.0  # 0.25, 0.5, 1, 2 (jittered down to half)
    finish(take(limit, seq=10), LimitOutcome.DROPPED, retry_after=3.0)
    assert limit.state().paused_for == pytest.approx(3.0)  # the server's advice, if any
    clock.advance(3.0)
    finish(take(limit, seq=11), LimitOutcome.SUCCESS)  # back: the backoff starts over
    finish(take(limit, seq=12), LimitOutcome.DROPPED)
    assert limit.state().paused_for <= 0.25


def test_after_sheds_at_the_floor_the_limit_slow_starts_to_half_of_what_it_was() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=16).endpoint(E)
    for i in range(40):  # one shed per round trip: 16 -> ... -> 1, then pauses
        finish(take(limit, seq=i), LimitOutcome.DROPPED)
        clock.advance(limit.state().paused_for)
    assert limit.state().limit == 1
    slow_start_back(limit)
    assert 8 <= limit.state().limit <= 10  # slow start up to 16 / 2, not stuck at 1


async def test_a_pause_that_begins_while_a_task_waits_is_slept_through() -> None:
    limit = ConcurrencyLimiter(initial_limit=1, max_limit=1).endpoint(E)  # real time
    holder = take(limit)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    task = asyncio.create_task(waiter.wait_async(None))
    await asyncio.sleep(0.01)  # blocked on its wake-up, no pause yet
    finish(holder, LimitOutcome.RESTARTING, retry_after=0.2)  # the slot comes back paused
    granted = await asyncio.wait_for(task, 30)
    assert granted.queued_s >= 0.15  # granted when the pause ended, nobody released
    granted.release()


def test_growth_creeps_near_the_limit_at_which_the_server_went_down() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=20).endpoint(E)
    leases = [take(limit, seq=i) for i in range(20)]
    finish(leases[0], LimitOutcome.RESTARTING, retry_after=1.0)  # it went down at 20
    for lease in leases[1:]:
        lease.release()
    clock.advance(1.0)
    rounds = 0
    while limit.state().limit < 17:  # slow start to 10, then about + 1 per round trip
        full_round(limit)
        rounds += 1
        assert rounds < 40
    normal = 0
    while limit.state().limit < 18:
        full_round(limit)
        normal += 1
    creeping = 0
    while limit.state().limit < 19:  # past 0.9 x 20: eight times slower
        full_round(limit)
        creeping += 1
        assert creeping < 40
    assert normal <= 2 and creeping >= 5


def test_a_hot_kv_cache_holds_the_limit_and_a_server_queue_ends_slow_start() -> None:
    limit = limiter(initial_limit=2).endpoint(E)
    a, b = take(limit, seq=0), take(limit, seq=1)
    finish(a, LimitOutcome.SUCCESS, kv_cache_usage=0.95)
    assert limit.state().limit == 2
    finish(b, LimitOutcome.SUCCESS, queue_depth=3)  # the server queues: its batch is full
    state = limit.state()
    assert not state.slow_start and state.limit == 2  # 2 + 1/2: linear from here


def test_a_slow_first_token_holds_the_limit_and_ends_slow_start() -> None:
    limit = limiter(initial_limit=4).endpoint(E)

    def round_(ttft: float, seq: int) -> None:
        leases = [take(limit, seq=seq + i) for i in range(limit.state().limit)]
        for lease in leases:
            lease.mark(LimitOutcome.SUCCESS, None, ttft)
            lease.release()

    round_(0.10, 0)  # 4 -> 7 (the first was sent with 1 of 4 in flight)
    round_(0.10, 100)  # 7 -> 12: a baseline of fast first tokens
    grown = limit.state().limit
    round_(0.40, 200)  # over 2 x 0.10 + 0.05: the server has started to queue
    state = limit.state()
    assert state.limit == grown and not state.slow_start


def test_the_limit_stays_within_its_bounds() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=2, min_limit=2, max_limit=3).endpoint(E)
    for round_ in range(5):
        leases = [take(limit, seq=10 * round_ + i) for i in range(limit.state().limit)]
        for lease in leases:
            finish(lease, LimitOutcome.SUCCESS)
    assert limit.state().limit == 3
    for round_ in range(5):
        finish(take(limit, seq=100 + round_), LimitOutcome.DROPPED)
        clock.advance(limit.state().paused_for)
    assert limit.state().limit == 2


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, LimitOutcome.SUCCESS),
        (ServiceUnavailableError("x", status_code=503), LimitOutcome.DROPPED),  # vLLM queue full
        (
            ServiceUnavailableError(
                "x", status_code=503, server_load=ServerLoad(load_shed="queue_full")
            ),
            LimitOutcome.DROPPED,
        ),
        (
            ServiceUnavailableError(
                "x", status_code=503, server_load=ServerLoad(load_shed="engine_restart")
            ),
            LimitOutcome.RESTARTING,
        ),
        (RateLimitError("x", status_code=429), LimitOutcome.DROPPED),
        (APITimeoutError("t"), LimitOutcome.IGNORED),  # a long generation is no overload
        (ServiceUnavailableError("x", status_code=500), LimitOutcome.IGNORED),
    ],
)
def test_what_each_outcome_tells_the_limit(error: Exception | None, outcome: LimitOutcome) -> None:
    assert limit_outcome(error) is outcome


# -- the local queue --------------------------------------------------------------------


def test_waiters_go_by_priority_then_arrival_one_per_freed_slot() -> None:
    limit = limiter(initial_limit=1).endpoint(E)
    holder = take(limit, seq=0)
    waiters = {
        name: limit.acquire(rank, seq, FAR)
        for name, rank, seq in [
            ("sheddable", 2, 1),
            ("std-late", 1, 3),
            ("std", 1, 2),
            ("crit", 0, 4),
        ]
    }
    assert all(isinstance(w, SlotWaiter) for w in waiters.values())
    order = []
    lease = holder
    for _ in range(4):
        lease.release()
        granted = [
            n for n, w in waiters.items() if isinstance(w, SlotWaiter) and w.done and n not in order
        ]
        assert len(granted) == 1  # exactly one woken per freed slot
        order += granted
        lease = waiters[granted[0]].wait(0)  # type: ignore[union-attr]
    assert order == ["crit", "std", "std-late", "sheddable"]
    assert limit.state().waiting == 0


def test_a_rising_limit_wakes_as_many_as_it_has_room_for() -> None:
    limit = limiter(initial_limit=2).endpoint(E)
    a, b = take(limit, seq=0), take(limit, seq=1)
    waiters = [limit.acquire(1, 10 + i, FAR) for i in range(3)]
    finish(a, LimitOutcome.SUCCESS)  # slow start: limit 3, one slot freed -> two may go
    assert [w.done for w in waiters] == [True, True, False]  # type: ignore[union-attr]
    assert limit.state().in_flight == 3
    b.release()


def test_a_full_queue_refuses_at_once() -> None:
    limit = limiter(initial_limit=1, max_waiting=2).endpoint(E)
    take(limit, seq=0)
    limit.acquire(1, 1, FAR)
    limit.acquire(1, 2, FAR)
    with pytest.raises(LocalQueueFullError) as info:
        limit.acquire(1, 3, FAR)
    assert info.value.waiting == 2 and info.value.endpoint == E
    assert limit.state().refused == 1


def test_a_deadline_the_queue_cannot_meet_fails_at_once_with_the_estimate() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=1, max_limit=1).endpoint(E)
    for i in range(5):  # one slot freed per second: the measured rate
        lease = take(limit, seq=i)
        clock.advance(1.0)
        finish(lease, LimitOutcome.SUCCESS)
    take(limit, seq=10)
    ok = limit.acquire(1, 11, deadline_at=clock.now() + 30.0)  # one ahead of nobody: ~1 s
    assert isinstance(ok, SlotWaiter)
    with pytest.raises(QueueTimeoutError) as info:
        limit.acquire(1, 12, deadline_at=clock.now() + 1.5)  # second in line: ~2 s
    err = info.value
    assert isinstance(err, APITimeoutError)
    assert err.estimated_wait_s == pytest.approx(2.0, rel=0.3) and err.queued_s == 0.0
    assert "before the call's deadline" in str(err)


def test_a_waiter_whose_deadline_becomes_hopeless_is_failed_without_waiting_for_it() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=2).endpoint(E)
    for i in range(6):  # two slots freed per second
        lease = take(limit, seq=i)
        clock.advance(0.5)
        finish(lease, LimitOutcome.SUCCESS)
    held = [take(limit, seq=10 + i) for i in range(limit.state().limit)]
    queued = [limit.acquire(1, 20 + i, deadline_at=clock.now() + 3.0) for i in range(4)]
    assert all(isinstance(w, SlotWaiter) for w in queued)
    clock.advance(2.5)  # nothing freed meanwhile: the back of the line cannot make it now
    finish(held[0], LimitOutcome.IGNORED)
    results = []
    for waiter in queued:
        assert isinstance(waiter, SlotWaiter) and waiter.done  # nobody left hanging
        try:
            results.append(type(waiter.wait(0)).__name__)
        except QueueTimeoutError as exc:
            assert exc.queued_s == pytest.approx(2.5)
            results.append("refused")
    assert results[0] == "Lease" and results[-1] == "refused"


def test_a_backlog_waiting_out_a_restart_is_not_failed_by_the_first_small_rounds() -> None:
    """After a restart the limit slow-starts from 1: the releases of its first rounds
    are few, but the limit it heads for frees slots far faster, and the backlog has
    the time to wait for it."""
    clock = FakeClock()
    limit = limiter(clock, initial_limit=16, max_limit=16).endpoint(E)
    for round_ in range(3):  # 16 calls a second, each holding its slot for 1 s
        batch = [take(limit, seq=100 * round_ + i) for i in range(16)]
        clock.advance(1.0)
        for lease in batch:
            finish(lease, LimitOutcome.SUCCESS)
    crashed = take(limit, seq=999)
    finish(crashed, LimitOutcome.RESTARTING, retry_after=12.0)  # down longer than the window
    waiters = [limit.acquire(1, 1000 + i, deadline_at=clock.now() + 60.0) for i in range(300)]
    clock.advance(12.0)
    served, rounds = 0, 0
    while served < 300:
        limit.poll()
        leases = [w.wait(0) for w in waiters if isinstance(w, SlotWaiter) and w.done]
        waiters = [w for w in waiters if not (isinstance(w, SlotWaiter) and w.done)]
        assert leases, f"{limit.state()} after {served} served"
        clock.advance(1.0)
        for lease in leases:
            finish(lease, LimitOutcome.SUCCESS)
        served += len(leases)
        rounds += 1
    assert limit.state().refused == 0 and rounds < 48  # all in time: 1, 2, 4, 8, then ~16 a round


def test_a_waiter_that_cannot_outlast_a_pause_that_begins_fails_at_once() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=1, max_limit=1).endpoint(E)
    probe = take(limit)
    waiter = limit.acquire(1, 1, deadline_at=clock.now() + 2.0)
    assert isinstance(waiter, SlotWaiter)
    limit.poll()  # a sweep just ran: the next one is not due for a while
    clock.advance(0.01)
    finish(probe, LimitOutcome.DROPPED, retry_after=5.0)  # refused at the floor: 5 s pause
    assert waiter.done  # 2 s left, 5 s to wait: told now, not at its deadline
    with pytest.raises(QueueTimeoutError) as info:
        waiter.wait(0)
    assert info.value.estimated_wait_s == pytest.approx(5.0)


def test_a_spent_quota_pauses_the_endpoint_at_most_a_minute_and_keeps_its_limit() -> None:
    clock = FakeClock()
    limit = limiter(clock, initial_limit=2).endpoint(E)
    holders = [take(limit, seq=0), take(limit, seq=3)]
    staying = limit.acquire(1, 1, deadline_at=clock.now() + 120.0)
    leaving = limit.acquire(1, 2, deadline_at=clock.now() + 30.0)
    assert isinstance(staying, SlotWaiter) and isinstance(leaving, SlotWaiter)
    limit.pause(86_000.0)  # "reset in 86000s": a minute at most
    assert limit.state().paused_for == MAX_PAUSE_S == 60.0
    assert leaving.done and not staying.done  # 30 s left cannot outlast it: told now
    limit.pause(float("nan"))
    limit.pause(-5.0)
    assert limit.state().paused_for == 60.0
    for holder in holders:
        finish(holder, LimitOutcome.SUCCESS)
    assert not staying.done  # nothing is granted during the pause
    clock.advance(60.0)
    limit.poll()
    assert staying.done and limit.state().limit == 4  # slow start, 2 -> 4: no drop


def test_a_wait_that_reaches_its_timeout_leaves_the_queue() -> None:
    limit = limiter(initial_limit=1).endpoint(E)
    holder = take(limit, seq=0)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    with pytest.raises(QueueTimeoutError, match="deadline passed while it waited"):
        waiter.wait(0.01)
    assert limit.state().waiting == 0
    holder.release()
    assert limit.state().in_flight == 0  # nobody was granted the freed slot


def test_threads_never_hold_more_slots_than_the_limit() -> None:
    limit = ConcurrencyLimiter(initial_limit=3, max_limit=3).endpoint(E)
    lock = threading.Lock()
    now_held, peak, done = [0], [0], []

    def worker(seq: int) -> None:
        got = limit.acquire(1, seq, FAR)
        lease = got if isinstance(got, Lease) else got.wait(30.0)
        with lock:
            now_held[0] += 1
            peak[0] = max(peak[0], now_held[0])
        with lock:
            now_held[0] -= 1
        finish(lease, LimitOutcome.SUCCESS)
        done.append(seq)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 40 and peak[0] <= 3
    assert limit.state().in_flight == 0 and limit.state().waiting == 0


async def test_a_cancelled_task_leaves_the_queue_and_gives_back_a_granted_slot() -> None:
    limit = ConcurrencyLimiter(initial_limit=1).endpoint(E)
    holder = take(limit, seq=0)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    task = asyncio.create_task(waiter.wait_async(None))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limit.state().waiting == 0
    holder.release()
    assert limit.state().in_flight == 0

    holder = take(limit, seq=2)
    waiter = limit.acquire(1, 3, FAR)
    assert isinstance(waiter, SlotWaiter)
    task = asyncio.create_task(waiter.wait_async(None))
    await asyncio.sleep(0)
    holder.release()  # granted (wake-up scheduled) ...
    task.cancel()  # ... and cancelled before it ran: the slot goes back
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limit.state().in_flight == 0


async def test_a_task_is_woken_from_another_thread() -> None:
    limit = ConcurrencyLimiter(initial_limit=1).endpoint(E)
    holder = take(limit, seq=0)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    threading.Timer(0.05, holder.release).start()
    lease = await asyncio.wait_for(waiter.wait_async(None), 30)
    assert lease.queued_s >= 0 and limit.state().in_flight == 1
    lease.release()


@pytest.mark.parametrize("timeout", [0.0, 0.01])
async def test_a_task_whose_wait_reaches_its_timeout_leaves_the_queue(timeout: float) -> None:
    limit = ConcurrencyLimiter(initial_limit=1).endpoint(E)
    holder = take(limit, seq=0)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    with pytest.raises(QueueTimeoutError, match="deadline passed while it waited"):
        await waiter.wait_async(timeout)
    assert limit.state().waiting == 0
    holder.release()
    assert limit.state().in_flight == 0  # nobody was granted the freed slot


async def test_a_release_on_the_loop_runs_the_granted_task_on_the_next_pass() -> None:
    """A release by another task of the same loop settles the waiter's future at once:
    the granted task runs on the loop's next pass, not after several hops through a
    ready queue that may hold hundreds of tasks."""
    limit = ConcurrencyLimiter(initial_limit=1).endpoint(E)
    holder = take(limit, seq=0)
    waiter = limit.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    task = asyncio.create_task(waiter.wait_async(30))
    await asyncio.sleep(0)  # the task now waits
    holder.release()
    await asyncio.sleep(0)  # one pass of the loop
    assert task.done()
    task.result().release()
    assert limit.state().in_flight == 0


# -- the table of endpoints ------------------------------------------------------------


def test_the_table_keeps_at_most_max_endpoints_and_never_one_in_use() -> None:
    clock = FakeClock()
    lim = limiter(clock, max_endpoints=8, initial_limit=1)
    busy = take(lim.endpoint("busy:1"))  # a slot held all along
    queued = lim.endpoint("queued:1")
    holder = take(queued)
    waiter = queued.acquire(1, 1, FAR)
    assert isinstance(waiter, SlotWaiter)
    lim.endpoint("paused:1").pause(30.0)
    for i in range(1_000):  # addresses that come and go, each used once
        clock.advance(0.01)
        finish(take(lim.endpoint(f"10.0.{i // 256}.{i % 256}:8000")), LimitOutcome.SUCCESS)
        assert len(lim.state()) <= 8
    names = {s.endpoint for s in lim.state()}
    assert {"busy:1", "queued:1", "paused:1"} <= names  # in use: never dropped
    assert lim.endpoint("busy:1").state().in_flight == 1
    busy.release()
    assert lim.endpoint("busy:1").state().in_flight == 0
    holder.release()
    assert waiter.done and lim.endpoint("queued:1") is queued
    waiter.wait(0).release()
    assert lim.endpoint("paused:1").state().paused_for > 0  # still paused, still kept
    clock.advance(30.0)
    for i in range(20):
        finish(take(lim.endpoint(f"10.9.0.{i}:8000")), LimitOutcome.SUCCESS)
    assert 7 <= len(lim.state()) <= 8  # idle now: dropped, oldest first, an eighth at a time
    assert not {"busy:1", "queued:1", "paused:1"} & {s.endpoint for s in lim.state()}


def test_a_forgotten_endpoint_is_dropped_once_nothing_uses_it() -> None:
    lim = limiter(initial_limit=2)
    idle, busy = lim.endpoint("10.0.0.5:8000"), lim.endpoint("10.0.0.6:8000")
    lease = take(busy)
    take(idle).release()
    lim.forget(["10.0.0.5:8000", "10.0.0.6:8000", "10.0.0.7:8000"])
    assert [s.endpoint for s in lim.state()] == ["10.0.0.6:8000"]  # in use: kept for now
    lease.release()
    assert lim.state() == ()
    again = lim.endpoint("10.0.0.5:8000")  # the address came back: it starts fresh
    assert again is not idle and again.state().limit == 2


def test_an_entry_dropped_between_lookup_and_acquire_hands_out_the_live_one() -> None:
    lim = limiter(initial_limit=1)
    stale = lim.endpoint(E)
    lim.forget([E])  # dropped while a call held it, before it asked for a slot
    lease = stale.acquire(1, 0, FAR)
    assert isinstance(lease, Lease)
    live = lim.endpoint(E)
    assert live is not stale and live.state().in_flight == 1  # one table, one count
    assert isinstance(live.acquire(1, 1, FAR), SlotWaiter)
    lease.release()
    assert live.state().in_flight == 1  # the waiter got the slot


def test_threads_churning_the_table_only_ever_get_slots_of_its_entries() -> None:
    # Another thread drops the entries as fast as it can (as discovery would after a
    # deploy) while calls look them up and take slots: a slot is always counted by
    # the table's entry, never by one it dropped meanwhile.
    lim = ConcurrencyLimiter(initial_limit=1000, max_limit=1000, max_endpoints=4)
    names = [f"10.0.0.{i}:8000" for i in range(3)]
    wrong: list[str] = []
    done = threading.Event()

    def dropper() -> None:
        while not done.is_set():
            lim.forget(names)
            time.sleep(0)

    def caller(seed: int) -> None:
        for i in range(200):
            name = names[(seed + i) % len(names)]
            limit = lim.endpoint(name)
            time.sleep(0)  # let the dropper run between the look-up and the slot
            lease = limit.acquire(1, 0, FAR)
            assert isinstance(lease, Lease)
            if lim.endpoint(name) is not lease._limit:
                wrong.append(name)
            lease.release()

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(3)]
    drop = threading.Thread(target=dropper)
    drop.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    drop.join()
    assert wrong == []
    assert all(s.in_flight == 0 for s in lim.state())


def test_waiters_that_left_do_not_pile_up_in_the_queue() -> None:
    # An endpoint whose slots are all held (a server that never answers): every call
    # queues and gives up. Their places must not stay in the queue for good.
    clock = FakeClock()
    limit = limiter(clock, initial_limit=1, max_waiting=16).endpoint(E)
    take(limit)
    for i in range(5_000):
        waiter = limit.acquire(1, i + 1, deadline_at=clock.now() + 1.0)
        assert isinstance(waiter, SlotWaiter)
        with pytest.raises(QueueTimeoutError):
            waiter.wait(0)
    assert limit.state().waiting == 0
    assert len(limit._queue) <= 2 * 16 + 64


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "release", "forget", "pause"]), st.integers(0, 40)),
        max_size=200,
    )
)
def test_the_table_stays_bounded_and_in_use_entries_keep_their_count(
    steps: list[tuple[str, int]],
) -> None:
    clock = FakeClock()
    lim = limiter(clock, max_endpoints=4, initial_limit=3)
    held: dict[str, list[Lease]] = {}
    for op, n in steps:
        clock.advance(0.1)
        name = f"10.0.0.{n}:8000"
        before = len(lim.state())
        if op == "take":
            got = lim.endpoint(name).acquire(1, lim.next_seq(), FAR)
            if isinstance(got, Lease):
                held.setdefault(name, []).append(got)
            else:
                got.wait(0) if got.done else lim.endpoint(name)._abandon(got)
        elif op == "release" and held.get(name):
            held[name].pop().release()
        elif op == "forget":
            lim.forget([name])
        elif op == "pause":
            lim.endpoint(name).pause(n / 10)
        in_use = {name for name, leases in held.items() if leases}
        after = len(lim.state())
        if after > before:  # an entry was made: only a take or a pause makes one
            assert op in ("take", "pause")
            paused = {s.endpoint for s in lim.state() if s.paused_for > 0}
            # Entries in use stay beyond the cap (and the one just made beside them);
            # an idle one goes first.
            assert after <= max(4, len(in_use | paused) + 1)
        # A table past the cap (entries in use then) is not emptied by a pause that
        # runs out or a release: it shrinks as the next entry is made.
        for busy in in_use:  # the table's entry is the one the leases count in
            assert lim.endpoint(busy).state().in_flight == len(held[busy])


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_limit": 0},
        {"min_limit": 0},
        {"max_limit": -1},
        {"initial_limit": 2.5},
        {"min_limit": 5, "initial_limit": 2},
        {"initial_limit": 300, "max_limit": 200},
        {"backoff_ratio": 1.0},
        {"backoff_ratio": 0},
        {"max_waiting": -1},
        {"initial_limit": True},
        {"max_endpoints": 0},
    ],
)
def test_nonsense_configuration_is_a_clear_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must"):
        ConcurrencyLimiter(**kwargs)  # type: ignore[arg-type]
