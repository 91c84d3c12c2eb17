"""The drill end to end with a tiny workload: it completes and reports every field.

Figures are not asserted: they depend on the machine (docs/benchmarks.md has a full
run's). Three pairings at a time keep the test short; the real drill runs them one
after another.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

TOP_LEVEL = {
    "mode",
    "seed",
    "engine",
    "engine_args",
    "cold_start_s",
    "concurrency",
    "workload",
    "patience",
    "logical_requests_per_pairing",
    "calibration",
    "machine",
    "wall_time_s",
    "pairings",
}
PER_PAIRING = {
    "client",
    "admission",
    "logical_requests",
    "client_attempts",
    "server_attempts",
    "server_attempts_by_number",
    "retry_amplification_server",
    "retry_amplification_client",
    "incident_retry_amplification_server",
    "app_calls",
    "success_rate",
    "long_success_rate",
    "goodput_tps",
    "goodput_ratio",
    "burst_goodput_tps",
    "burst_goodput_ratio",
    "burst_demand_tps",
    "latency_p50_s",
    "latency_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "oom_count",
    "restart_count",
    "crash_count",
    "oom_restart_loop_count",
    "recovery_s",
    "gone_client_tokens",
    "engine_output_tokens",
    "max_in_flight",
    "errors",
    "client_stats",
    "timeseries",
}
SERIES = {"attempts_per_s", "successes_per_s", "queue_depth", "kv_cache_usage", "restarts"}
PLOTS = {f"{name}.png" for name in SERIES}


@pytest.mark.timeout(90)
def test_drill_quick_tiny_completes_with_every_field(tmp_path: Path) -> None:
    out = tmp_path / "drill"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stormguard_server.drill",
            "--quick",
            "--tiny",
            "--concurrency",
            "3",
            "--seed",
            "7",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    document = json.loads((out / "drill.json").read_text())
    assert document.keys() >= TOP_LEVEL
    assert {"capacity_tps", "calls", "window_s", "concurrency"} <= document["calibration"].keys()
    assert {"nproc", "cpu_model", "python"} <= document["machine"].keys()
    pairs = {(p["client"], p["admission"]) for p in document["pairings"]}
    assert pairs == {
        (client, admission)
        for client in ("openai", "openai+tenacity", "stormguard")
        for admission in ("off", "on")
    }
    for pairing in document["pairings"]:
        assert pairing.keys() >= PER_PAIRING, PER_PAIRING - pairing.keys()
        assert pairing["timeseries"].keys() >= SERIES

    assert {p.name for p in out.glob("*.png")} >= PLOTS
    assert "openai+tenacity" in done.stdout  # the table
