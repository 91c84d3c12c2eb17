"""The wait estimate on its own: hold times measured from releases, and when the
tokens a request needs come back."""

from __future__ import annotations

import pytest

from stormguard_server.admission.wait_estimate import (
    HoldMeter,
    HoldModel,
    ReleaseSchedule,
    wait_until_fits,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_fit_tells_prefill_from_decoding() -> None:
    clock = FakeClock()
    meter = HoldMeter(5.0, clock)
    assert meter.model() is None and meter.mean_hold_s() is None
    # 1 ms per prompt token, 10 ms per output token.
    for prompt, output in ((100, 10), (1000, 10), (100, 100), (500, 50)):
        meter.record(
            tokens=prompt + output,
            prompt=prompt,
            output=output,
            held_s=0.001 * prompt + 0.01 * output,
        )
    model = meter.model()
    assert model is not None
    assert model.per_prompt_s == pytest.approx(0.001)
    assert model.per_output_s == pytest.approx(0.01)
    holds = [0.2, 1.1, 1.1, 1.0]
    tokens = [110, 1010, 200, 550]
    assert meter.mean_hold_s() == pytest.approx(
        sum(t * h for t, h in zip(tokens, holds, strict=True)) / sum(tokens)
    )


def test_one_shape_of_request_is_fitted_on_its_output_and_never_negatively() -> None:
    clock = FakeClock()
    meter = HoldMeter(5.0, clock)
    for _ in range(3):
        meter.record(tokens=150, prompt=50, output=100, held_s=1.0)
    model = meter.model()
    assert model == HoldModel(per_prompt_s=0.0, per_output_s=pytest.approx(0.01))
    # Bigger prompts that hold for less: no negative seconds per prompt token.
    meter.record(tokens=1100, prompt=1000, output=100, held_s=0.5)
    model = meter.model()
    assert model is not None and model.per_prompt_s >= 0 and model.per_output_s > 0


def test_without_max_tokens_the_whole_cost_is_the_prompt() -> None:
    clock = FakeClock()
    meter = HoldMeter(5.0, clock)
    meter.record(tokens=200, prompt=200, output=0, held_s=1.0)
    assert meter.model() == HoldModel(per_prompt_s=pytest.approx(0.005), per_output_s=0.0)


def test_the_window_slides_but_a_pause_never_empties_it() -> None:
    clock = FakeClock()
    meter = HoldMeter(5.0, clock)
    for _ in range(20):
        meter.record(tokens=10, prompt=5, output=5, held_s=1.0)
    clock.now = 3600.0  # an hour of nothing: idle, or an engine that restarted
    meter.record(tokens=10, prompt=5, output=5, held_s=3.0)
    # The newest 16 are kept however old: 15 of 1 s and the new one of 3 s.
    assert meter.mean_hold_s() == pytest.approx((15 * 1.0 + 3.0) / 16)
    for _ in range(16):
        meter.record(tokens=10, prompt=5, output=5, held_s=3.0)
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
