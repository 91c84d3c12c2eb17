"""Fault switches with an injected clock."""

from __future__ import annotations

import pytest

from stormguard_server.config import FaultConfig
from stormguard_server.engine.faults import FaultState


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def test_error_rate_is_seeded_and_bounded() -> None:
    one = FaultState(FaultConfig(error_rate=0.3, seed=7))
    two = FaultState(FaultConfig(error_rate=0.3, seed=7))
    flips = [one.should_inject_error() for _ in range(1000)]
    assert flips == [two.should_inject_error() for _ in range(1000)]
    assert 200 < sum(flips) < 400
    assert not any(FaultState().should_inject_error() for _ in range(100))
    with pytest.raises(ValueError):
        one.set_error_rate(1.5)


def test_hang_rate_is_seeded_bounded_and_in_the_snapshot() -> None:
    one = FaultState(FaultConfig(hang_rate=0.3, seed=7))
    two = FaultState(FaultConfig(hang_rate=0.3, seed=7))
    flips = [one.should_hang() for _ in range(1000)]
    assert flips == [two.should_hang() for _ in range(1000)]
    assert 200 < sum(flips) < 400
    assert not any(FaultState().should_hang() for _ in range(100))
    assert one.snapshot().hang_rate == 0.3
    with pytest.raises(ValueError, match="hang rate"):
        one.set_hang_rate(-0.1)


def test_stall_counts_down_on_the_clock() -> None:
    clock = Clock()
    faults = FaultState(FaultConfig(stall_s=2.0), clock=clock)
    assert faults.stall_remaining() == 2.0
    clock.now += 1.5
    assert faults.stall_remaining() == pytest.approx(0.5)
    faults.stall(0)
    assert faults.stall_remaining() == 0
    with pytest.raises(ValueError):
        faults.stall(-1)


def test_crash_request_is_taken_once() -> None:
    faults = FaultState()
    assert faults.take_crash_request() is False
    faults.request_crash()
    assert faults.snapshot().crash_pending is True
    assert faults.take_crash_request() is True
    assert faults.take_crash_request() is False


def test_added_latency_and_snapshot() -> None:
    faults = FaultState(FaultConfig(added_latency_s=0.25), oom_crash=False)
    snap = faults.snapshot()
    assert snap.added_latency_s == 0.25 and snap.oom_crash is False
    with pytest.raises(ValueError):
        faults.set_added_latency(-0.1)
