"""The provider-outage scenario's schedule of faults and its figures, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from stormguard_drill.outage.config import OutageConfig, outage_preset, outage_schedule
from stormguard_drill.outage.records import CallRecord, OutageRun
from stormguard_drill.outage.summary import (
    back_on_primary_s,
    check_targets,
    peak_over_offered,
    summarize_outage,
)

CONFIG = OutageConfig(
    "full",
    healthy_s=10,
    outage_s=20,
    recovery_s=10,
    after_s=20,
    primary_latency_s=0.1,
    error_rate=0.3,
    hang_rate=0.2,
    ttft_factor=10,
)


def call(start: float, provider: str | None = "primary", ok: bool = True) -> CallRecord:
    return CallRecord(
        start_s=start,
        latency_s=0.5,
        ttft_s=0.2,
        ok=ok,
        provider=provider if ok else None,
        error=None if ok else "deadline",
    )


def test_the_primarys_faults_are_off_then_on_then_fall_linearly_to_nothing() -> None:
    healthy = {"error_rate": 0.0, "hang_rate": 0.0, "added_latency_ms": 100.0}
    assert CONFIG.faults_at(0) == healthy
    assert CONFIG.faults_at(9.9) == healthy
    out = {"error_rate": 0.3, "hang_rate": 0.2, "added_latency_ms": 1000.0}
    assert CONFIG.faults_at(10) == out  # x10 time to first token
    assert CONFIG.faults_at(29.9) == out
    assert CONFIG.faults_at(35) == {"error_rate": 0.15, "hang_rate": 0.1, "added_latency_ms": 550.0}
    assert CONFIG.faults_at(40) == healthy
    assert CONFIG.faults_at(55) == healthy


def test_the_windows_follow_one_another_and_the_schedule_fills_them() -> None:
    assert CONFIG.window_bounds() == {
        "healthy": (0, 10),
        "outage": (10, 30),
        "recovery": (30, 40),
        "after": (40, 60),
    }
    schedule = outage_schedule(CONFIG)
    assert schedule == outage_schedule(CONFIG)  # seeded: every client gets the same
    assert schedule[0].at_s > 0 and schedule[-1].at_s < CONFIG.duration_s
    assert 400 < len(schedule) < 800  # 10 calls a second for 60 s


@pytest.mark.parametrize("mode", ["full", "quick", "tiny"])
def test_the_presets(mode: Any) -> None:
    config = outage_preset(mode)
    if mode == "full":  # the task's outage and recovery; one pairing at a time
        assert (config.outage_s, config.recovery_s, config.concurrency) == (60, 30, 1)
    if mode == "quick":  # under two minutes: its pairings at once
        assert config.duration_s + 30 < 120 and config.concurrency == 4


def test_back_on_the_primary_from_the_first_bin_after_which_every_bin_is() -> None:
    calls = [call(40 + i, "secondary") for i in range(5)]  # bin 40-45: all secondary
    calls += [call(45 + i, "primary" if i % 4 else "secondary") for i in range(5)]  # 60 %
    calls += [call(50 + i) for i in range(10)]  # 50-60: all primary
    assert back_on_primary_s(calls, 40, 60, 0.9) == 10.0
    assert back_on_primary_s([call(40 + i) for i in range(20)], 40, 60, 0.9) == 0.0
    assert back_on_primary_s([call(40 + i, "secondary") for i in range(20)], 40, 60, 0.9) is None
    # A bin with no served call says nothing either way.
    assert back_on_primary_s([call(41), call(55)], 40, 60, 0.9) == 0.0


def counted(*points: tuple[float, float]) -> list[tuple[float, dict[str, float]]]:
    return [(t, {"stormguard_attempts_total": n}) for t, n in points]


def run_of(client: str, calls: list[CallRecord], primary: float, secondary: float) -> OutageRun:
    """A run whose servers counted ``primary``/``secondary`` attempts during the outage."""
    return OutageRun(
        client,  # type: ignore[arg-type]
        calls,
        counted((10.0, 0.0), (30.0, primary)),
        counted((10.0, 0.0), (30.0, secondary)),
        {},
        [],
    )


def test_the_primarys_peak_is_its_attempts_over_the_calls_offered_meanwhile() -> None:
    calls = [call(30 + i * 0.25) for i in range(40)]  # 4 calls a second from 30 s
    steady = counted((30, 0), (32, 8), (34, 16), (36, 24))
    assert peak_over_offered(steady, calls, 30) == 1.0
    burst = counted((30, 0), (32, 8), (34, 30), (36, 38))  # 22 attempts for 8 calls
    assert peak_over_offered(burst, calls, 30) == 2.75
    assert peak_over_offered(steady, calls[:3], 30) is None  # too few calls to judge


def test_a_pairings_figures_and_the_targets_on_stormguards_row() -> None:
    outage = [call(10 + i * 0.2, "secondary") for i in range(100)]
    after = [call(40 + i * 0.2) for i in range(100)]
    ours = summarize_outage(run_of("stormguard", outage + after, 5, 100), CONFIG)
    assert ours["outage_success_rate"] == 1.0
    assert ours["outage_secondary_share"] == 1.0
    assert ours["outage_attempts_per_call"] == 1.05
    assert ours["outage_primary_attempts_per_call"] == 0.05
    assert ours["back_on_primary_s"] == 0.0
    failing = [call(10 + i * 0.2, ok=i % 2 == 0) for i in range(100)]
    theirs = summarize_outage(run_of("openai", failing + after, 150, 0), CONFIG)
    assert theirs["outage_success_rate"] == 0.5
    assert theirs["windows"]["outage"]["errors"] == {"deadline": 50}
    checks = check_targets([ours, theirs], CONFIG)
    assert checks["outage_success"]["met"] is True
    assert checks["outage_attempts_per_call"]["met"] is True
    assert checks["back_on_primary_s"]["met"] is True
    assert "p99_vs_litellm_router" not in checks  # it did not run
    assert checks["p99_vs_openai"]["value"] == 0.5
    assert check_targets([theirs], CONFIG) == {}
