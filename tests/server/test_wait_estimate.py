"""The wait estimate on its own: hold times measured from releases, and when the
tokens a request needs come back."""

from __future__ import annotations

import pytest

from stormguard_server.wait_estimate import HoldMeter, ReleaseSchedule, wait_until_fits


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_hold_meter_weighs_by_tokens_and_work() -> None:
    clock = FakeClock()
    meter = HoldMeter(5.0, clock)
    assert meter.seconds_per_work() is None and meter.mean_hold_s() is None
    meter.record(tokens=100, work=10, held_s=1.0)
    meter.record(tokens=300, work=30, held_s=3.0)
    assert meter.seconds_per_work() == pytest.approx(4.0 / 40)
    assert meter.mean_hold_s() == pytest.approx((100 * 1.0 + 300 * 3.0) / 400)


def test_the_window_slides_but_a_pause_never_empties_it() -> None:
    clock = FakeClock()
    meter = HoldMeter(5.0, clock)
    for _ in range(20):
        meter.record(tokens=10, work=10, held_s=1.0)
    clock.now = 3600.0  # an hour of nothing: idle, or an engine that restarted
    meter.record(tokens=10, work=10, held_s=3.0)
    # The newest 16 are kept however old: 15 of 1 s and the new one of 3 s.
    assert meter.mean_hold_s() == pytest.approx((15 * 1.0 + 3.0) / 16)
    for _ in range(16):
        meter.record(tokens=10, work=10, held_s=3.0)
    assert meter.mean_hold_s() == pytest.approx(3.0)


def test_wait_until_fits_walks_the_running_requests_by_their_ends() -> None:
    now = 10.0
    # Expected to end in 3 s, 1 s ago (overdue: back at once) and in 1 s.
    running = ReleaseSchedule([(now + 3.0, 100), (now - 1.0, 100), (now + 1.0, 100)])
    assert running.tokens == 300

    def wait(tokens: int) -> float | None:
        return wait_until_fits(tokens, 50, running, mean_hold_s=2.0, now=now)

    assert wait(50) == 0.0  # fits now
    assert wait(150) == 0.0
    assert wait(250) == pytest.approx(1.0)
    assert wait(350) == pytest.approx(3.0)
    # Past the running 300: the 50 free now come back after one hold, then the
    # running ones' room, one hold after their ends.
    assert wait(400) == pytest.approx(2.0)
    assert wait(500) == pytest.approx(2.0)
    assert wait(600) == pytest.approx(3.0)
    assert wait(700) == pytest.approx(5.0)
    assert wait(1050) == pytest.approx(7.0)


def test_nothing_running_and_nothing_free_never_fits() -> None:
    assert wait_until_fits(10, 0, ReleaseSchedule([]), mean_hold_s=1.0, now=0.0) is None
