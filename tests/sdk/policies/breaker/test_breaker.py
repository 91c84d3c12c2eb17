"""CircuitBreaker alone: every transition, open-time growth, probes, events, threads,
the failure classifier and the per-(endpoint, model) registry."""

from __future__ import annotations

import asyncio
import doctest
import logging
import random
import threading
from typing import Any

import pytest

import stormguard._policies.breaker.circuit
from stormguard._core.exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    CircuitOpenError,
    ContextWindowExceededError,
    InternalServerError,
    NotFoundError,
    QueueTimeoutError,
    RateLimitError,
    ServiceUnavailableError,
    StreamInterruptedError,
    ThrottledError,
    TokenRateLimitedError,
    UnprocessableEntityError,
)
from stormguard._core.verdict import classify
from stormguard._policies.breaker.circuit import CircuitBreaker, Permit
from stormguard._policies.breaker.config import BreakerConfig
from stormguard._policies.breaker.registry import BreakerRegistry
from stormguard._policies.breaker.states import BreakerTransition, CircuitState
from stormguard.protocol import ServerLoad
from stormguard.testing import FakeClock

CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


class Recorder:
    def __init__(self) -> None:
        self.events: list[BreakerTransition] = []

    def __call__(self, transition: BreakerTransition) -> None:
        self.events.append(transition)

    @property
    def path(self) -> list[tuple[str, str, str]]:
        return [(e.from_state.value, e.to_state.value, e.reason) for e in self.events]


def make(clock: FakeClock, recorder: Recorder | None = None, **config: Any) -> CircuitBreaker:
    config.setdefault("jitter", 0.0)
    # Short windows and runs keep the tests readable (the defaults are 100/50/10).
    config.setdefault("window_size", 20)
    config.setdefault("minimum_calls", 10)
    config.setdefault("consecutive_failures", 5)
    return CircuitBreaker(
        "m@http://gpu-1/v1",
        BreakerConfig(**config),
        clock=clock,
        rng=random.Random(7),
        listeners=[recorder] if recorder is not None else [],
    )


def feed(breaker: CircuitBreaker, outcomes: str, *, duration: float = 0.1) -> None:
    """One call per letter: F fails, S succeeds, L succeeds slowly (duration 100 s)."""
    for letter in outcomes:
        permit = breaker.before_call()
        if letter == "F":
            permit.failure(duration)
        elif letter == "S":
            permit.success(duration)
        else:
            permit.success(100.0)


def trip(breaker: CircuitBreaker, retry_after: float | None = None) -> None:
    while breaker.state is not OPEN:
        breaker.before_call().failure(retry_after=retry_after)


def open_for(breaker: CircuitBreaker) -> float:
    retry_in = breaker.snapshot().retry_in
    assert retry_in is not None
    return retry_in


# -- closed -> open -----------------------------------------------------------------------


def test_failure_rate_trips_once_minimum_calls_are_in() -> None:
    rec = Recorder()
    breaker = make(FakeClock(), rec, consecutive_failures=None)
    feed(breaker, "FSFSFSFSF")  # 5 of 9 failed (56 %), but fewer than 10 calls
    assert breaker.state is CLOSED
    assert breaker.snapshot().failures == 5
    feed(breaker, "S")  # 5 of 10: the threshold is reached
    assert breaker.state is OPEN
    assert rec.path == [("closed", "open", "failure_rate")]


def test_failure_rate_below_threshold_stays_closed() -> None:
    breaker = make(FakeClock(), consecutive_failures=None)
    feed(breaker, "FSS" * 20)  # one in three, 60 calls
    state = breaker.snapshot()
    assert state.state is CLOSED
    assert (state.calls, state.failures) == (20, 6)  # the window holds the last 20


def test_window_slides_over_the_last_n_calls() -> None:
    breaker = make(FakeClock(), consecutive_failures=None, window_size=10, minimum_calls=10)
    feed(breaker, "S" * 10 + "FFFF")  # 4 of the last 10
    assert breaker.state is CLOSED
    feed(breaker, "F")  # the fifth failure pushes out a success: 5 of 10
    assert breaker.state is OPEN


def test_consecutive_failures_trip_before_minimum_calls() -> None:
    rec = Recorder()
    breaker = make(FakeClock(), rec)
    feed(breaker, "FFFFSFFFF")  # a success resets the run
    assert breaker.state is CLOSED
    feed(breaker, "F")
    assert breaker.state is OPEN
    assert rec.path == [("closed", "open", "consecutive_failures")]


def test_slow_calls_trip_at_the_slow_rate() -> None:
    rec = Recorder()
    breaker = make(FakeClock(), rec, slow_call_duration=10.0)
    feed(breaker, "SSL" + "LLLLLL")  # 7 slow of 9: under the minimum
    assert breaker.state is CLOSED
    feed(breaker, "L")  # 8 slow of 10 = 0.8
    assert breaker.state is OPEN
    assert rec.path == [("closed", "open", "slow_call_rate")]


def test_slow_calls_are_ignored_when_tracking_is_off() -> None:
    breaker = make(FakeClock())
    feed(breaker, "L" * 40)
    assert breaker.state is CLOSED
    assert breaker.snapshot().slow_calls == 0


def test_duration_defaults_to_time_since_the_permit() -> None:
    clock = FakeClock()
    breaker = make(clock, slow_call_duration=10.0, minimum_calls=1, slow_call_rate_threshold=0.5)
    permit = breaker.before_call()
    clock.advance(9.0)
    permit.success()
    assert breaker.snapshot().slow_calls == 0
    permit = breaker.before_call()
    clock.advance(10.5)
    permit.success()
    assert breaker.state is OPEN


# -- open ----------------------------------------------------------------------------------


def test_open_fails_fast_with_retry_in() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    with pytest.raises(CircuitOpenError) as info:
        breaker.before_call()
    assert info.value.breaker == "m@http://gpu-1/v1"
    assert info.value.retry_in == pytest.approx(5.0)
    assert info.value.attempts == 0
    clock.advance(3.0)
    with pytest.raises(CircuitOpenError) as info:
        breaker.before_call()
    assert info.value.retry_in == pytest.approx(2.0)


def test_open_becomes_half_open_when_the_open_time_is_up() -> None:
    clock = FakeClock()
    rec = Recorder()
    breaker = make(clock, rec)
    trip(breaker)
    clock.advance(4.99)
    assert breaker.state is OPEN
    clock.advance(0.01)
    assert breaker.state is HALF_OPEN
    assert rec.path[-1] == ("open", "half_open", "open_time_elapsed")
    assert rec.events[-1].at == pytest.approx(5.0)


def test_retry_after_lengthens_the_open_time() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker, retry_after=30.0)
    assert open_for(breaker) == pytest.approx(30.0)
    clock.advance(29.9)
    assert breaker.state is OPEN


def test_retry_after_of_an_earlier_failure_still_counts() -> None:
    clock = FakeClock()
    breaker = make(clock)
    breaker.before_call().failure(retry_after=20.0)
    clock.advance(4.0)
    feed(breaker, "FFFF")  # trips at t=4; the server said "back at t=20"
    assert open_for(breaker) == pytest.approx(16.0)


def test_retry_after_is_capped_and_shorter_ones_do_not_shorten() -> None:
    breaker = make(FakeClock())
    trip(breaker, retry_after=3600.0)
    assert open_for(breaker) == pytest.approx(60.0)
    short = make(FakeClock())
    trip(short, retry_after=1.0)
    assert open_for(short) == pytest.approx(5.0)


def test_jitter_only_lengthens() -> None:
    times = []
    for seed in range(50):
        breaker = CircuitBreaker(
            "b", BreakerConfig(jitter=0.1), clock=FakeClock(), rng=random.Random(seed)
        )
        trip(breaker, retry_after=10.0)
        times.append(open_for(breaker))
    assert all(10.0 <= t <= 11.0 for t in times)
    assert max(times) - min(times) > 0.5  # spread, not one value


# -- half open -----------------------------------------------------------------------------


def half_open(clock: FakeClock, rec: Recorder | None = None, **config: Any) -> CircuitBreaker:
    breaker = make(clock, rec, **config)
    trip(breaker)
    clock.advance(open_for(breaker))
    assert breaker.state is HALF_OPEN
    return breaker


def test_half_open_admits_a_limited_number_of_probes() -> None:
    breaker = half_open(FakeClock())
    first, second = breaker.before_call(), breaker.before_call()
    assert first.probe and second.probe
    with pytest.raises(CircuitOpenError) as info:
        breaker.before_call()
    assert info.value.retry_in is None
    assert breaker.snapshot().probes_in_flight == 2


def test_accepting_says_whether_a_permit_would_be_granted() -> None:
    clock = FakeClock()
    breaker = make(clock)
    assert breaker.accepting
    trip(breaker)
    assert not breaker.accepting
    clock.advance(5.0)
    assert breaker.accepting  # half-open, probe slots free
    first, _ = breaker.before_call(), breaker.before_call()
    assert not breaker.accepting
    assert breaker.snapshot().probes_in_flight == 2  # asking took no slot
    first.ignore()
    assert breaker.accepting


def test_ignore_releases_a_probe_slot_without_deciding() -> None:
    breaker = half_open(FakeClock())
    first, _ = breaker.before_call(), breaker.before_call()
    first.ignore()
    third = breaker.before_call()
    assert breaker.state is HALF_OPEN
    third.ignore()
    assert breaker.snapshot().probes_in_flight == 1


def test_probe_successes_close_and_reset() -> None:
    clock = FakeClock()
    rec = Recorder()
    breaker = half_open(clock, rec)
    breaker.before_call().success()
    assert breaker.state is HALF_OPEN  # one of two
    breaker.before_call().success()
    assert breaker.state is CLOSED
    assert rec.path[-1] == ("half_open", "closed", "probes_succeeded")
    state = breaker.snapshot()
    assert (state.calls, state.failures, state.consecutive_failures) == (0, 0, 0)
    trip(breaker)  # growth starts over after a close
    assert open_for(breaker) == pytest.approx(5.0)
    assert breaker.snapshot().trips == 2


def test_half_open_successes_can_exceed_the_probe_slots() -> None:
    breaker = half_open(FakeClock(), half_open_calls=1, half_open_successes=3)
    for _ in range(2):
        breaker.before_call().success()
        assert breaker.state is HALF_OPEN
    breaker.before_call().success()
    assert breaker.state is CLOSED


def test_probe_failure_reopens_with_doubled_time_up_to_the_cap() -> None:
    clock = FakeClock()
    rec = Recorder()
    breaker = make(clock, rec)
    trip(breaker)
    seen = []
    for _ in range(6):
        seen.append(open_for(breaker))
        clock.advance(seen[-1])
        breaker.before_call().failure()
    seen.append(open_for(breaker))
    assert seen == pytest.approx([5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0])
    assert rec.path[-1] == ("half_open", "open", "probe_failed")
    assert [e.open_for for e in rec.events if e.to_state is OPEN] == pytest.approx(seen)


def test_probe_failure_with_retry_after_reopens_for_at_least_that() -> None:
    clock = FakeClock()
    breaker = half_open(clock)
    breaker.before_call().failure(retry_after=25.0)
    assert open_for(breaker) == pytest.approx(25.0)  # more than the grown 10 s


def test_a_slow_probe_reopens_when_slow_calls_are_tracked() -> None:
    rec = Recorder()
    breaker = half_open(FakeClock(), rec, slow_call_duration=10.0)
    breaker.before_call().success(30.0)
    assert breaker.state is OPEN
    assert rec.path[-1] == ("half_open", "open", "probe_slow")


def test_a_probe_never_settled_loses_its_slot_after_max_open_time() -> None:
    clock = FakeClock()
    breaker = half_open(clock)
    _abandoned = breaker.before_call(), breaker.before_call()
    clock.advance(59.0)
    with pytest.raises(CircuitOpenError):
        breaker.before_call()
    clock.advance(1.0)
    breaker.before_call().success()
    breaker.before_call().success()
    assert breaker.state is CLOSED


def test_outcomes_of_permits_from_an_earlier_state_are_dropped() -> None:
    clock = FakeClock()
    breaker = make(clock)
    stale = [breaker.before_call() for _ in range(3)]  # in flight when it trips
    trip(breaker)
    stale[0].failure()  # reported while open
    clock.advance(5.0)
    assert breaker.state is HALF_OPEN
    stale[1].failure(retry_after=50.0)  # reported while half-open: not a probe
    assert breaker.state is HALF_OPEN
    breaker.before_call().success()
    breaker.before_call().success()
    stale[2].failure()  # reported after closing
    assert breaker.snapshot().calls == 0


def test_settling_twice_is_a_no_op() -> None:
    breaker = make(FakeClock())
    permit = breaker.before_call()
    permit.success()
    permit.failure()
    permit.ignore()
    assert permit.settled
    state = breaker.snapshot()
    assert (state.calls, state.failures) == (1, 0)


def test_ignore_counts_nothing_when_closed() -> None:
    breaker = make(FakeClock())
    for _ in range(50):
        breaker.before_call().ignore()
    assert breaker.snapshot().calls == 0


# -- events --------------------------------------------------------------------------------


def test_a_full_cycle_emits_every_transition_in_order() -> None:
    clock = FakeClock(start=100.0)
    rec = Recorder()
    breaker = make(clock, rec)
    trip(breaker)
    clock.advance(5.0)
    breaker.before_call().failure()
    clock.advance(10.0)
    breaker.before_call().success()
    breaker.before_call().success()
    assert rec.path == [
        ("closed", "open", "consecutive_failures"),
        ("open", "half_open", "open_time_elapsed"),
        ("half_open", "open", "probe_failed"),
        ("open", "half_open", "open_time_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
    ]
    assert [e.at for e in rec.events] == pytest.approx([100.0, 105.0, 105.0, 115.0, 115.0])
    assert [e.open_for for e in rec.events] == [5.0, None, 10.0, None, None]
    assert {e.name for e in rec.events} == {"m@http://gpu-1/v1"}


def test_a_failing_listener_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(transition: BreakerTransition) -> None:
        raise RuntimeError("telemetry is down")

    rec = Recorder()
    breaker = CircuitBreaker(
        "b", BreakerConfig(jitter=0), clock=FakeClock(), listeners=[broken, rec]
    )
    with caplog.at_level(logging.ERROR, logger="stormguard._breaker"):
        trip(breaker)
    assert breaker.state is OPEN
    assert rec.path == [("closed", "open", "consecutive_failures")]
    assert "telemetry is down" in caplog.text


def test_listeners_run_outside_the_lock_and_may_call_back() -> None:
    clock = FakeClock()
    seen: list[tuple[str, CircuitState]] = []
    breaker: CircuitBreaker

    def listener(transition: BreakerTransition) -> None:
        # Calls back into the breaker: would deadlock if called under its lock.
        seen.append((transition.reason, breaker.snapshot().state))
        if transition.to_state is OPEN:
            clock.advance(10.0)
            breaker.before_call().ignore()  # makes the open -> half_open change itself

    config = BreakerConfig(jitter=0, consecutive_failures=5)
    breaker = CircuitBreaker("b", config, clock=clock, listeners=[listener])
    feed(breaker, "FFFFF")
    assert seen == [
        ("consecutive_failures", OPEN),
        ("open_time_elapsed", HALF_OPEN),
    ]


# -- threads -------------------------------------------------------------------------------


def test_threads_hammering_a_closed_breaker_keep_counts_exact() -> None:
    config = BreakerConfig(
        window_size=10_000, minimum_calls=10_000, consecutive_failures=None, jitter=0
    )
    breaker = CircuitBreaker("b", config, clock=FakeClock())

    def worker(n: int) -> None:
        for i in range(500):
            permit = breaker.before_call()
            if i % 5 == 0:
                permit.failure()
            elif i % 5 == 1:
                permit.ignore()
            else:
                permit.success()
            permit.success()  # a second settle must never count

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = breaker.snapshot()
    assert (state.calls, state.failures, state.state) == (8 * 400, 8 * 100, CLOSED)


def test_threads_racing_for_probes_get_exactly_the_slots() -> None:
    clock = FakeClock()
    breaker = half_open(clock, half_open_calls=3)
    barrier = threading.Barrier(16)
    granted: list[Permit] = []
    refused: list[CircuitOpenError] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            permit = breaker.before_call()
        except CircuitOpenError as exc:
            with lock:
                refused.append(exc)
        else:
            with lock:
                granted.append(permit)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(granted), len(refused)) == (3, 13)
    for permit in granted:
        permit.success()
    assert breaker.state is CLOSED


def test_concurrent_trips_emit_one_transition() -> None:
    rec = Recorder()
    breaker = make(FakeClock(), rec, consecutive_failures=1)
    permits = [breaker.before_call() for _ in range(32)]
    threads = [threading.Thread(target=p.failure) for p in permits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rec.path == [("closed", "open", "consecutive_failures")]
    assert breaker.snapshot().trips == 1


# -- what counts as a failure ----------------------------------------------------------------


def status(cls: type[APIStatusError], code: int, **load: Any) -> APIStatusError:
    return cls("x", status_code=code, server_load=ServerLoad(**load))


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        pytest.param(None, False, id="success"),
        pytest.param(APIConnectionError("refused"), True, id="connection"),
        pytest.param(APITimeoutError("t"), True, id="timeout"),
        pytest.param(APITimeoutError("t", response_started=True), True, id="timeout-mid-body"),
        pytest.param(status(InternalServerError, 500), True, id="500"),
        pytest.param(status(InternalServerError, 502), True, id="502"),
        pytest.param(
            status(ServiceUnavailableError, 503, load_shed="engine_restart"),
            False,
            id="503-restart",
        ),
        pytest.param(
            status(ServiceUnavailableError, 503, load_shed="warming"), False, id="warming"
        ),
        pytest.param(
            status(ServiceUnavailableError, 503, load_shed="queue_full"), False, id="503-queue-full"
        ),
        pytest.param(
            status(ServiceUnavailableError, 503, should_retry=False, load_shed="retry_shed"),
            False,
            id="503-retry-shed",
        ),
        pytest.param(status(ServiceUnavailableError, 503), False, id="503-vllm-queue-full"),
        pytest.param(status(InternalServerError, 504), True, id="504"),
        pytest.param(status(APIStatusError, 408), True, id="408"),
        pytest.param(status(RateLimitError, 429, load_shed="queue_full"), False, id="429-shed"),
        pytest.param(status(RateLimitError, 429), False, id="429-caller-rate"),
        pytest.param(
            status(RateLimitError, 429, should_retry=False), False, id="429-should-retry-false"
        ),
        pytest.param(status(BadRequestError, 400, load_shed="too_long"), False, id="400-too-long"),
        pytest.param(status(BadRequestError, 400), False, id="400"),
        pytest.param(status(AuthenticationError, 401), False, id="401"),
        pytest.param(status(NotFoundError, 404), False, id="404"),
        pytest.param(status(UnprocessableEntityError, 422), False, id="422"),
        pytest.param(StreamInterruptedError("cut", chunks_received=0), True, id="cut-before"),
        pytest.param(StreamInterruptedError("cut", chunks_received=3), False, id="cut-after"),
        pytest.param(APIResponseValidationError("bad", status_code=200), True, id="bad-body"),
        pytest.param(CircuitOpenError("open", breaker="b"), False, id="circuit-open"),
        pytest.param(ThrottledError("t", probability=0.5), False, id="throttled"),
        pytest.param(QueueTimeoutError("q", queued_s=1.0), False, id="local-queue-timeout"),
        pytest.param(TokenRateLimitedError("t", tokens=1, wait=1.0), False, id="token-rate"),
        pytest.param(
            ContextWindowExceededError(
                "big", model="m", prompt_tokens=9, max_tokens=9, context_window=8, counter="c"
            ),
            False,
            id="context-window",
        ),
        pytest.param(asyncio.CancelledError(), False, id="cancelled"),
        pytest.param(KeyboardInterrupt(), False, id="keyboard-interrupt"),
        pytest.param(ValueError("caller bug"), False, id="other"),
    ],
)
def test_is_breaker_failure(error: BaseException | None, failure: bool) -> None:
    assert classify(error).breaker_failure is failure


def test_settle_classifies_and_passes_the_retry_after_on() -> None:
    breaker = make(FakeClock(), consecutive_failures=1)
    breaker.before_call().settle(status(BadRequestError, 400))
    breaker.before_call().settle(None)
    assert (breaker.snapshot().calls, breaker.state) == (1, CLOSED)  # the 400 was ignored
    breaker.before_call().settle(status(ServiceUnavailableError, 503, load_shed="queue_full"))
    assert breaker.state is CLOSED  # a shed says "alive, but full": not a failure
    crash = status(InternalServerError, 502, retry_after=42.0)
    breaker.before_call().settle(crash)
    assert breaker.state is OPEN
    assert open_for(breaker) == pytest.approx(42.0)


# -- registry and config ---------------------------------------------------------------------


def test_registry_keeps_one_breaker_per_endpoint_and_model() -> None:
    rec = Recorder()
    registry = BreakerRegistry(BreakerConfig(jitter=0), clock=FakeClock(), listeners=[rec])
    a = registry.get("http://gpu-1/v1", "llama")
    assert registry.get("http://gpu-1/v1", "llama") is a
    b = registry.get("http://gpu-1/v1", "qwen")
    c = registry.get("http://gpu-2/v1", "llama")
    d = registry.get("http://gpu-2/v1")
    assert len({id(a), id(b), id(c), id(d)}) == 4
    assert (a.name, d.name) == ("llama@http://gpu-1/v1", "http://gpu-2/v1")
    trip(a)
    assert (b.state, c.state) == (CLOSED, CLOSED)
    assert rec.path == [("closed", "open", "consecutive_failures")]
    assert rec.events[0].name == "llama@http://gpu-1/v1"
    states = registry.snapshot()
    assert states[("http://gpu-1/v1", "llama")].state is OPEN
    assert states[("http://gpu-2/v1", None)].state is CLOSED


def test_registry_forgets_the_least_recently_used_past_its_bound() -> None:
    registry = BreakerRegistry(max_breakers=3, clock=FakeClock())
    first = registry.get("e", "m0")
    registry.get("e", "m1")
    registry.get("e", "m2")
    assert registry.get("e", "m0") is first  # used again: now the most recent
    registry.get("e", "m3")  # evicts m1
    assert len(registry) == 3
    assert registry.get("e", "m0") is first
    assert set(registry.snapshot()) == {("e", "m0"), ("e", "m2"), ("e", "m3")}
    for i in range(2000):
        registry.get("e", f"many-{i}")
    assert len(registry) == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_size": 0},
        {"minimum_calls": 0},
        {"minimum_calls": 101},
        {"failure_rate_threshold": 0},
        {"failure_rate_threshold": 1.5},
        {"slow_call_rate_threshold": float("nan")},
        {"consecutive_failures": 0},
        {"slow_call_duration": 0},
        {"slow_call_duration": float("inf")},
        {"open_time": 0},
        {"open_time": 10, "max_open_time": 5},
        {"max_open_time": float("inf")},
        {"jitter": -0.1},
        {"half_open_calls": 0},
        {"half_open_successes": 0},
    ],
)
def test_config_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**kwargs)


def test_registry_rejects_a_zero_bound() -> None:
    with pytest.raises(ValueError):
        BreakerRegistry(max_breakers=0)


def test_docstring_examples() -> None:
    assert doctest.testmod(stormguard._policies.breaker.circuit).failed == 0


def test_default_consecutive_run_is_ten() -> None:
    # A window the rate rule cannot fill, so only the run of failures can trip it.
    config = BreakerConfig(window_size=100, minimum_calls=100)
    rec = Recorder()
    breaker = CircuitBreaker("d", config, clock=FakeClock(), listeners=[rec])
    feed(breaker, "F" * 9)
    assert breaker.state is CLOSED
    feed(breaker, "F")
    assert rec.path == [("closed", "open", "consecutive_failures")]
