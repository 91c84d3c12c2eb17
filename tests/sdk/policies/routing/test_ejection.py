"""EjectionTracker alone, on a fake clock: every rule that takes an endpoint out of
rotation or brings it back, the evidence each attempt gives, and what it shows."""

from __future__ import annotations

import doctest
import logging
import random
from collections.abc import Callable, Sequence

import pytest

import stormguard._policies.routing.ejection
from stormguard._core.exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APITimeoutError,
    BadRequestError,
    CircuitOpenError,
    InternalServerError,
    QueueTimeoutError,
    RateLimitError,
    ServiceUnavailableError,
)
from stormguard._io.connect_check import connect_check
from stormguard._policies.routing.ejection import EjectionTracker
from stormguard._policies.routing.ejection_config import EjectionConfig
from stormguard._policies.routing.ejection_rules import Evidence, evidence_of
from stormguard._policies.routing.ejection_status import EjectionTransition, EndpointStatus
from stormguard._policies.routing.endpoint_config import Endpoint
from stormguard._policies.routing.endpoint_state import EndpointState
from stormguard.protocol import ServerLoad
from stormguard.testing import FakeClock

ACTIVE, EJECTED, PROBATION = EndpointStatus.ACTIVE, EndpointStatus.EJECTED, EndpointStatus.PROBATION
OK, FAIL, GONE, NONE = Evidence.SUCCESS, Evidence.FAILURE, Evidence.UNREACHABLE, Evidence.NONE


class Probes:
    """Connect checks asked for, answered by the test (``answer``), run inline."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, float]] = []
        self.reachable = False
        self.queued: list[Callable[[], None]] = []

    def probe(self, host: str, port: int, timeout: float) -> bool:
        self.asked.append((host, port, timeout))
        return self.reachable

    def run(self, work: Callable[[], None]) -> None:
        self.queued.append(work)

    def answer(self, reachable: bool) -> None:
        self.reachable = reachable
        work, self.queued = self.queued, []
        for item in work:
            item()


class Fleet:
    """Endpoints and a tracker over them, on a fake clock."""

    def __init__(
        self,
        n: int = 3,
        *,
        models: Sequence[Sequence[str] | None] | None = None,
        seed: int = 0,
        **config: object,
    ) -> None:
        self.clock = FakeClock()
        self.probes = Probes()
        config.setdefault("probe", self.probes.probe)
        self.states = [
            EndpointState(
                Endpoint(f"http://gpu-{i}:8000/v1", models=None if models is None else models[i])
            )
            for i in range(n)
        ]
        self.events: list[EjectionTransition] = []
        self.tracker = EjectionTracker(
            EjectionConfig(**config),  # type: ignore[arg-type]
            states=lambda: self.states,
            clock=self.clock,
            rng=random.Random(seed),
            listeners=[self.events.append],
            run_probe=self.probes.run,
        )

    def __getitem__(self, i: int) -> EndpointState:
        return self.states[i]

    def record(self, i: int, *evidence: Evidence) -> list[bool]:
        return [self.tracker.record(self.states[i], e) for e in evidence]

    def status(self, i: int) -> EndpointStatus:
        return self.tracker.snapshot()[i].status

    def path(self) -> list[tuple[str, str, str]]:
        return [(e.endpoint, e.to_status.value, e.reason) for e in self.events]


# -- evidence ------------------------------------------------------------------------


def _load(**kwargs: object) -> ServerLoad:
    return ServerLoad(**kwargs)  # type: ignore[arg-type]


QUEUE_FULL = _load(load_shed="queue_full")


@pytest.mark.parametrize(
    ("error", "response_seen", "expected"),
    [
        (None, True, OK),
        (APIConnectionError("Connection error (ConnectError: refused)"), False, GONE),
        (APIConnectionError("Server disconnected without sending a response"), False, GONE),
        # Cut after the status line: the server took the request; a crash-like failure.
        (APIConnectionError("Connection lost while reading the response"), True, FAIL),
        (APITimeoutError("timed out"), False, FAIL),
        (InternalServerError("boom", status_code=500), True, FAIL),
        (APIResponseValidationError("not JSON", status_code=200), True, FAIL),
        # Sheds: overload is not connectivity; the limiter handles them.
        (ServiceUnavailableError("full", status_code=503, server_load=QUEUE_FULL), True, NONE),
        (ServiceUnavailableError("vLLM queue full", status_code=503), True, NONE),
        (RateLimitError("slow down", status_code=429, server_load=QUEUE_FULL), True, NONE),
        (RateLimitError("your quota", status_code=429), True, NONE),
        (BadRequestError("bad", status_code=400), True, NONE),
        (CircuitOpenError("open", breaker="x"), False, NONE),
        (QueueTimeoutError("no slot", queued_s=1.0), False, NONE),
    ],
)  # fmt: skip
def test_what_each_outcome_says_about_its_endpoint(
    error: BaseException | None, response_seen: bool, expected: Evidence
) -> None:
    assert evidence_of(error, response_seen=response_seen) is expected


def test_a_shed_never_ejects() -> None:
    fleet = Fleet()
    shed = ServiceUnavailableError(
        "full", status_code=503, server_load=_load(load_shed="queue_full", retry_after=2.0)
    )
    for _ in range(50):
        assert not fleet.tracker.record(fleet[0], evidence_of(shed, response_seen=True))
    assert fleet.status(0) is ACTIVE
    assert fleet.tracker.snapshot()[0].failures == 0
    assert fleet.events == []


# -- unreachable: out at once, back through a connect check ---------------------------


def test_a_refused_connection_ejects_at_once() -> None:
    fleet = Fleet()
    assert fleet.record(0, GONE) == [True]
    assert not fleet.tracker.usable(fleet[0])
    assert fleet.tracker.usable(fleet[1]) and fleet.tracker.usable(fleet[2])
    health = fleet.tracker.snapshot()[0]
    assert (health.status, health.reason, health.ejections) == (EJECTED, "unreachable", 1)
    assert health.ejected_for is not None and 0.8 <= health.ejected_for <= 1.2
    assert fleet.path() == [("gpu-0:8000", "ejected", "unreachable")]
    assert fleet.events[0].ejected_for == health.ejected_for


def test_no_connect_check_before_the_backoff_and_none_twice_at_once() -> None:
    fleet = Fleet()
    fleet.record(0, GONE)
    until = fleet.tracker.snapshot()[0].ejected_for
    assert until is not None
    fleet.clock.advance(until - 0.01)
    assert not fleet.tracker.usable(fleet[0])
    assert fleet.probes.queued == []
    fleet.clock.advance(0.02)
    for _ in range(5):  # many calls look; one check goes
        assert not fleet.tracker.usable(fleet[0])
    assert len(fleet.probes.queued) == 1
    fleet.probes.answer(reachable=False)
    assert fleet.probes.asked == [("gpu-0", 8000, 5.0)]


@pytest.mark.parametrize("seed", range(20))
def test_connect_checks_back_off_as_grpc_with_jitter_bounds(seed: int) -> None:
    fleet = Fleet(seed=seed)
    fleet.record(0, GONE)
    backoff = 1.0
    waits: list[float] = []
    for _ in range(14):
        wait = fleet.tracker.snapshot()[0].ejected_for
        assert wait is not None
        waits.append(wait)
        assert 0.8 * backoff <= wait <= 1.2 * backoff
        fleet.clock.advance(wait)
        assert not fleet.tracker.usable(fleet[0])
        fleet.probes.answer(reachable=False)
        backoff = min(backoff * 1.6, 5.0)
    assert backoff == 5.0  # max_reconnect_backoff: reached at the fifth check
    assert all(e.reason == "probe_failed" for e in fleet.events[1:])
    assert fleet.tracker.snapshot()[0].reason == "unreachable"  # the cause stays
    assert fleet.tracker.snapshot()[0].ejections == 1


def test_a_passed_connect_check_returns_it_on_probation_then_two_successes_restore_it() -> None:
    fleet = Fleet()
    fleet.record(0, GONE)
    fleet.clock.advance(1.3)
    fleet.tracker.usable(fleet[0])
    fleet.probes.answer(reachable=True)
    assert fleet.status(0) is PROBATION and fleet.tracker.usable(fleet[0])
    fleet.record(0, OK)
    assert fleet.status(0) is PROBATION
    fleet.record(0, OK)
    assert fleet.status(0) is ACTIVE
    assert [p[1:] for p in fleet.path()] == [
        ("ejected", "unreachable"),
        ("probation", "reachable"),
        ("active", "probation_passed"),
    ]
    # Restored: the backoff starts again from 1 s.
    fleet.record(0, GONE)
    wait = fleet.tracker.snapshot()[0].ejected_for
    assert wait is not None and wait <= 1.2


def test_refused_again_on_probation_is_out_again_for_longer() -> None:
    fleet = Fleet(seed=3)
    fleet.record(0, GONE)
    fleet.clock.advance(1.3)
    fleet.tracker.usable(fleet[0])
    fleet.probes.answer(reachable=True)  # the port opens, the server is not up yet
    assert fleet.record(0, GONE) == [True]
    wait = fleet.tracker.snapshot()[0].ejected_for
    assert wait is not None and 1.6 * 0.8 <= wait <= 1.6 * 1.2


def test_probe_call_returns_it_after_the_backoff_without_a_connect_check() -> None:
    fleet = Fleet(probe="call")
    fleet.record(0, GONE)
    fleet.clock.advance(1.25)
    assert fleet.tracker.usable(fleet[0])  # the next call is the probe
    assert fleet.status(0) is PROBATION
    assert fleet.probes.queued == [] and fleet.probes.asked == []


def test_a_connect_check_that_raises_counts_as_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(host: str, port: int, timeout: float) -> bool:
        raise RuntimeError("bad probe")

    fleet = Fleet(probe=broken)
    fleet.record(0, GONE)
    fleet.clock.advance(1.3)
    fleet.tracker.usable(fleet[0])
    with caplog.at_level(logging.ERROR, logger="stormguard._ejection"):
        fleet.probes.answer(reachable=True)
    assert fleet.status(0) is EJECTED
    assert "Connect check of gpu-0:8000 failed" in caplog.text


def test_connect_check_against_a_port_that_refuses() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        assert not connect_check("127.0.0.1", sock.getsockname()[1], 2.0)
        sock.listen()
        assert connect_check("127.0.0.1", sock.getsockname()[1], 2.0)


# -- failing: consecutive failures and success-rate outliers ---------------------------


def test_five_failures_in_a_row_eject() -> None:
    fleet = Fleet()
    assert fleet.record(1, FAIL, FAIL, FAIL, FAIL) == [False] * 4
    fleet.record(1, OK)  # the run is broken
    assert fleet.record(1, FAIL, FAIL, FAIL, FAIL) == [False] * 4
    assert fleet.record(1, FAIL) == [True]
    health = fleet.tracker.snapshot()[1]
    assert (health.status, health.reason) == (EJECTED, "consecutive_failures")
    assert health.ejected_for is not None and 10.0 <= health.ejected_for <= 11.0


def test_success_rate_outlier_needs_the_minimum_volume_on_both_sides() -> None:
    fleet = Fleet(consecutive_failures=None)
    fleet.record(2, *[OK] * 10)  # the others' rate: 100 % over 10 calls
    # Half of nine calls failed: not judged yet (fewer than min_requests).
    assert fleet.record(1, OK, FAIL, OK, FAIL, OK, FAIL, OK, FAIL, FAIL) == [False] * 9
    assert fleet.status(1) is ACTIVE
    assert fleet.record(1, FAIL) == [True]  # 4 of 10: 40 % < 100 % - 30 %
    assert fleet.tracker.snapshot()[1].reason == "success_rate"


def test_no_outlier_without_another_endpoint_to_compare_with() -> None:
    fleet = Fleet(consecutive_failures=None)
    fleet.record(2, *[OK] * 9)  # below the volume: not a reference
    assert fleet.record(1, *[FAIL, OK] * 10) == [False] * 20
    assert fleet.status(1) is ACTIVE


def test_errors_shared_by_every_endpoint_are_no_outlier() -> None:
    # 20 % transient errors everywhere: the bar is the others' mean - 30 points.
    fleet = Fleet(consecutive_failures=None)
    pattern = [OK, OK, FAIL, OK, OK, OK, OK, FAIL, OK, OK]
    fleet.record(0, *pattern)
    fleet.record(2, *pattern)
    assert not any(fleet.record(1, *pattern, OK, FAIL, OK, FAIL, OK))
    assert fleet.status(1) is ACTIVE


def test_the_outlier_window_slides() -> None:
    fleet = Fleet(consecutive_failures=None)
    fleet.record(1, *[FAIL, OK, FAIL, OK] * 2)
    fleet.clock.advance(11.0)  # those eight are older than the 10 s interval
    fleet.record(2, *[OK] * 10)
    assert fleet.record(1, FAIL, OK) == [False, False]
    assert fleet.status(1) is ACTIVE


def test_ejection_time_grows_with_the_ejections_and_decays_in_rotation() -> None:
    fleet = Fleet(jitter=0.0, probation_successes=0)

    def eject() -> float:
        assert fleet.record(1, *[FAIL] * 5)[-1]
        wait = fleet.tracker.snapshot()[1].ejected_for
        assert wait is not None
        fleet.clock.advance(wait)
        assert fleet.tracker.usable(fleet[1])  # expired: back in rotation
        return wait

    assert [eject() for _ in range(3)] == [10.0, 20.0, 30.0]
    fleet.clock.advance(25.0)  # two intervals back in rotation: the multiplier falls by two
    assert eject() == 20.0
    for _ in range(20):
        eject()
    assert fleet.tracker.snapshot()[1].ejections == 24
    assert eject() == 120.0  # max_ejection_time


@pytest.mark.parametrize("seed", range(10))
def test_ejection_jitter_only_lengthens(seed: int) -> None:
    fleet = Fleet(seed=seed)
    fleet.record(1, *[FAIL] * 5)
    wait = fleet.tracker.snapshot()[1].ejected_for
    assert wait is not None and 10.0 <= wait <= 11.0


def test_ejection_expires_into_probation_and_a_failure_there_ejects_again() -> None:
    fleet = Fleet(jitter=0.0)
    fleet.record(1, *[FAIL] * 5)
    fleet.clock.advance(9.99)
    assert not fleet.tracker.usable(fleet[1])
    fleet.clock.advance(0.01)
    assert fleet.tracker.usable(fleet[1])
    assert fleet.status(1) is PROBATION
    assert fleet.record(1, OK, FAIL) == [False, True]  # one success is not enough
    health = fleet.tracker.snapshot()[1]
    assert (health.reason, health.ejected_for) == ("probation_failed", 20.0)
    assert [p[1:] for p in fleet.path()] == [
        ("ejected", "consecutive_failures"),
        ("probation", "ejection_time_elapsed"),
        ("ejected", "probation_failed"),
    ]


def test_evidence_from_before_the_return_is_ignored() -> None:
    fleet = Fleet(jitter=0.0)
    sent = fleet.clock.now()
    fleet.record(1, *[FAIL] * 5)
    fleet.clock.advance(10.0)
    assert fleet.tracker.usable(fleet[1])
    # A long call sent before the ejection fails now: it says nothing of the endpoint now.
    assert not fleet.tracker.record(fleet[1], FAIL, sent_at=sent)
    assert fleet.status(1) is PROBATION


# -- what ejection may not do -----------------------------------------------------------


def test_the_last_endpoint_is_never_ejected() -> None:
    fleet = Fleet(2)
    assert fleet.record(0, GONE) == [True]
    assert fleet.record(1, GONE) == [False]
    assert fleet.record(1, *[FAIL] * 20) == [False] * 20
    assert fleet.tracker.usable(fleet[1])
    solo = Fleet(1)
    assert not any(solo.record(0, GONE, *[FAIL] * 10))
    assert solo.status(0) is ACTIVE and solo.events == []


def test_the_last_endpoint_of_a_model_is_never_ejected() -> None:
    # gpu-0 alone serves "big"; gpu-1 and gpu-2 serve "small".
    fleet = Fleet(3, models=[["big"], ["small"], ["small"]])
    assert fleet.record(0, GONE) == [False]
    assert fleet.record(1, GONE) == [True]
    assert fleet.record(2, GONE) == [False]
    anything = Fleet(2, models=[None, ["small"]])
    assert anything.record(0, GONE) == [False]  # only it serves the other models
    assert anything.record(1, GONE) == [True]


def test_failures_eject_at_most_the_share_but_always_one() -> None:
    fleet = Fleet(5)
    assert fleet.record(0, *[FAIL] * 5)[-1]
    assert fleet.record(1, *[FAIL] * 5)[-1]  # 2 of 5 = 40 % <= 50 %
    assert not any(fleet.record(2, *[FAIL] * 10))  # 3 of 5 would be 60 %
    assert fleet.status(2) is ACTIVE
    # Unreachable endpoints do not count against the share, and are out regardless.
    assert fleet.record(3, GONE) == [True]
    small = Fleet(3, max_ejected_share=0.1)
    assert small.record(0, *[FAIL] * 5)[-1]  # always one
    assert not any(small.record(1, *[FAIL] * 5))


def test_the_share_frees_up_when_an_ejection_ends() -> None:
    fleet = Fleet(3, jitter=0.0, probation_successes=0)
    fleet.record(0, *[FAIL] * 5)
    assert not fleet.record(1, *[FAIL] * 5)[-1]
    fleet.clock.advance(10.0)
    assert fleet.tracker.usable(fleet[0])
    assert fleet.record(1, FAIL) == [True]  # its run of failures still counts


# -- the tracker's face -------------------------------------------------------------------


def test_a_listener_that_raises_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Fleet()
    heard: list[str] = []

    def bad(transition: EjectionTransition) -> None:
        raise RuntimeError("listener bug")

    tracker = EjectionTracker(
        EjectionConfig(probe="call"),
        states=lambda: fleet.states,
        clock=fleet.clock,
        listeners=[bad, lambda t: heard.append(t.reason)],
    )
    with caplog.at_level(logging.ERROR, logger="stormguard._ejection"):
        assert tracker.record(fleet[0], GONE)
    assert heard == ["unreachable"]
    assert "Ejection of" in caplog.text and "listener" in caplog.text


def test_a_changing_list_of_endpoints_keeps_each_ones_record() -> None:
    fleet = Fleet(3)
    fleet.record(0, GONE)
    kept = fleet.states[0]
    fleet.states = [kept, fleet.states[2], EndpointState(Endpoint("http://gpu-9:8000/v1"))]
    assert [h.endpoint for h in fleet.tracker.snapshot()] == [
        "gpu-0:8000",
        "gpu-2:8000",
        "gpu-9:8000",
    ]
    assert fleet.tracker.snapshot()[0].status is EJECTED


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="max_ejected_share"):
        EjectionConfig(max_ejected_share=1.5)
    with pytest.raises(ValueError, match="base_ejection_time"):
        EjectionConfig(base_ejection_time=0)
    with pytest.raises(ValueError, match="max_ejection_time"):
        EjectionConfig(base_ejection_time=30, max_ejection_time=10)
    with pytest.raises(ValueError, match="consecutive_failures"):
        EjectionConfig(consecutive_failures=0)
    with pytest.raises(ValueError, match="probe"):
        EjectionConfig(probe="ping")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reconnect_jitter"):
        EjectionConfig(reconnect_jitter=1.0)


def test_doctests() -> None:
    assert doctest.testmod(stormguard._policies.routing.ejection).failed == 0
