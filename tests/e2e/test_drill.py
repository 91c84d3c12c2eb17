"""The drill end to end with a tiny workload: it completes and reports every field.

Every scenario once (the avalanche, the burst, the rebound, the fleet, the quota), each
at the ``--tiny`` size.
Figures are not asserted: they depend on the machine (docs/benchmarks.md has a full
run's); only facts that hold however slow the machine is (admission keeps the engine
from any OOM; the rebound's crash is made and counted). Several pairings at a time keep
the tests short; the real drill runs them one after another.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Not in `make test`: about 105 s on 2 cores, so `make test-drill` runs them in a CI step
# of their own.
pytestmark = [pytest.mark.e2e, pytest.mark.drill]

TOP_LEVEL = {
    "scenario",
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
    "source",
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
# The burst's and the rebound's figures (the avalanche's burst window has no meaning there).
BACKLOG_PAIRING = (
    PER_PAIRING
    - {
        "incident_retry_amplification_server",
        "long_success_rate",
        "burst_goodput_tps",
        "burst_goodput_ratio",
        "burst_demand_tps",
        "recovery_s",
    }
) | {
    "drain_s",
    "ideal_drain_s",
    "p99_over_drain",
    "p99_over_ideal_drain",
    "crash_sent_s",
    "back_s",
    "goodput_after_restart_tps",
    "goodput_after_restart_ratio",
    "extra_crashes",
    "targets",
    "missed",
}
SERIES = {"attempts_per_s", "successes_per_s", "queue_depth", "kv_cache_usage", "restarts"}
PLOTS = {f"{name}.png" for name in SERIES}
ALL_CLIENTS = {
    "openai",
    "openai+tenacity",
    "stormguard",
    "openai+sg-httpx",
    "litellm",
    "litellm-router",
}


def run_drill(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "stormguard_drill", "--tiny", "--seed", "7"]
    done = subprocess.run(
        [*command, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def check_document(out: Path, scenario: str, per_pairing: set[str]) -> dict[str, Any]:
    """The JSON, table and plots every run writes; returns the JSON document."""
    document: dict[str, Any] = json.loads((out / "drill.json").read_text())
    assert document.keys() >= TOP_LEVEL
    assert document["scenario"] == scenario
    assert {"capacity_tps", "calls", "window_s", "concurrency"} <= document["calibration"].keys()
    assert document["calibration"]["capacity_tps"] > 0
    assert {"nproc", "cpu_model", "python"} <= document["machine"].keys()
    assert "stormguard_version" in document["source"]
    for pairing in document["pairings"]:
        assert pairing.keys() >= per_pairing, per_pairing - pairing.keys()
        assert pairing["timeseries"].keys() >= SERIES
        assert pairing["logical_requests"] == document["logical_requests_per_pairing"]
    assert {p.name for p in out.glob("*.png")} >= PLOTS
    assert (out / "table.md").read_text().startswith(f"**scenario {scenario}:")
    return document


@pytest.mark.timeout(90)
def test_drill_quick_tiny_completes_with_every_field(tmp_path: Path) -> None:
    out = tmp_path / "drill"
    done = run_drill(out, "--quick", "--concurrency", "3", timeout=80)

    document = check_document(out, "avalanche", PER_PAIRING)
    assert document["targets"] is None
    pairs = {(p["client"], p["admission"]) for p in document["pairings"]}
    assert pairs == {
        (client, admission)
        for client in ("openai", "openai+tenacity", "stormguard")
        for admission in ("off", "on")
    }
    assert done.stdout.startswith("scenario avalanche:")  # the table, under its title
    assert "openai+tenacity" in done.stdout


@pytest.mark.timeout(150)
def test_drill_burst_tiny_runs_every_client_behind_admission(tmp_path: Path) -> None:
    out = tmp_path / "burst"
    done = run_drill(out, "--scenario", "burst", "--concurrency", "3", timeout=140)

    document = check_document(out, "burst", BACKLOG_PAIRING)
    # Admission off is not run in the burst, and says why; LiteLLM runs where it can be
    # imported, and is skipped with the reason where it cannot.
    assert "admission off" in document["skipped"]
    clients = {p["client"] for p in document["pairings"]}
    assert clients | (document["skipped"].keys() & ALL_CLIENTS) == ALL_CLIENTS
    assert {"openai", "openai+tenacity", "stormguard", "openai+sg-httpx"} <= clients
    assert {p["admission"] for p in document["pairings"]} == {"on"}
    assert document["targets"]["min_goodput_ratio"] == 0.9
    for pairing in document["pairings"]:
        assert (pairing["oom_count"], pairing["crash_count"]) == (0, 0)  # admission holds
        assert pairing["crash_sent_s"] is None
        assert pairing["targets"].keys() == {"success", "attempts/call", "goodput/cap", "p99/drain"}
        assert set(pairing["missed"]) <= pairing["targets"].keys()
        assert pairing["server_attempts"] >= 1
        if pairing["client"] in {"litellm", "litellm-router"}:
            assert pairing["client_attempts"] is None  # counted at the server only
    for client in ("stormguard", "openai+sg-httpx"):
        (pairing,) = (p for p in document["pairings"] if p["client"] == client)
        assert pairing["timeseries"]["client_limit"]  # the limiter's state, sampled
    assert done.stdout.startswith("scenario burst:")
    assert "2nd crash" not in done.stdout  # no crash in the burst, no column for it


@pytest.mark.timeout(150)
def test_drill_rebound_tiny_crashes_the_engine_once_per_pairing(tmp_path: Path) -> None:
    out = tmp_path / "rebound"
    args = ("--scenario", "rebound", "--clients", "openai,stormguard", "--concurrency", "2")
    done = run_drill(out, *args, timeout=140)

    document = check_document(out, "rebound", BACKLOG_PAIRING)
    pairs = {(p["client"], p["admission"]) for p in document["pairings"]}
    assert pairs == {(c, a) for c in ("openai", "stormguard") for a in ("off", "on")}
    assert "--slow-start-s" in document["engine_args"]
    assert document["engine_args"][document["engine_args"].index("--slow-start-s") + 1] == "0"
    assert document["workload"]["crash_at_s"] == 1.0
    for pairing in document["pairings"]:
        assert pairing["crash_sent_s"] is not None  # the drill's own crash, made
        assert pairing["crash_count"] >= 1  # and counted by the engine
        assert pairing["extra_crashes"] == pairing["crash_count"] - 1
        assert "no 2nd crash" in pairing["targets"]
        if pairing["admission"] == "on":
            assert pairing["oom_count"] == 0  # admission: what comes back cannot OOM it
    assert done.stdout.startswith("scenario rebound:")
    assert "2nd crash" in done.stdout


FLEET_TOP_LEVEL = (TOP_LEVEL - {"cold_start_s", "concurrency", "calibration"}) | {
    "replicas",
    "processes",
    "timeline",
    "targets",
    "skipped",
}
FLEET_PAIRING = {
    "client",
    "admission",
    "logical_requests",
    "app_calls",
    "success_rate",
    "errors",
    "server_attempts",
    "retry_amplification_server",
    "client_attempts",
    "retry_amplification_client",
    "replicas",
    "sick_share",
    "dead_replica",
    "crash_loop",
    "slow_replica",
    "latency_p50_s",
    "latency_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "recovered_s",
    "recovery_s",
    "rejoin_s",
    "fault_errors",
    "processes",
    "ejection_log",
    "client_cpu_s",
    "timeseries",
    "targets",
    "missed",
}
FLEET_SERIES = {
    "attempts_per_s_by_replica",
    "client_attempts_per_s_by_replica",
    "successes_per_s",
    "replica_states",
}
FLEET_PLOTS = {
    "attempts_per_replica.png",
    "client_attempts_per_replica.png",
    "successes_per_s.png",
    "replica_states.png",
}


@pytest.mark.timeout(120)
def test_drill_fleet_tiny_does_every_fault_and_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    # stormguard alone: a pairing costs ~20 s of CPU (seven processes), and the test
    # proves the machinery, which every client shares; the full run compares them.
    done = run_drill(out, "--scenario", "fleet", "--clients", "stormguard", timeout=110)

    document: dict[str, Any] = json.loads((out / "drill.json").read_text())
    assert document.keys() >= FLEET_TOP_LEVEL, FLEET_TOP_LEVEL - document.keys()
    assert (document["scenario"], document["replicas"], document["processes"]) == ("fleet", 4, 3)
    (pairing,) = document["pairings"]
    assert pairing["client"] == "stormguard"
    assert {p.name for p in out.glob("*.png")} >= FLEET_PLOTS
    assert (out / "table.md").read_text().startswith("**scenario fleet:")
    assert done.stdout.startswith("scenario fleet:")
    assert "targets: success >= 99.9%" in done.stdout
    assert pairing.keys() >= FLEET_PAIRING, FLEET_PAIRING - pairing.keys()
    assert pairing["timeseries"].keys() >= FLEET_SERIES
    assert pairing["logical_requests"] == document["logical_requests_per_pairing"]
    assert sum(p["calls"] for p in pairing["processes"]) == pairing["logical_requests"]
    assert all("failovers" in p["client_stats"] for p in pairing["processes"])
    assert pairing["fault_errors"] == []  # every fault was done
    assert pairing["targets"].keys() == {"success", "attempts/call", "dead share", "p99 vs router"}
    assert pairing["targets"]["p99 vs router"]["measured"] is None  # no Router row
    assert set(pairing["missed"]) <= pairing["targets"].keys()
    # The dead replica: its port refused connections from the kill to the restart, it
    # answered nothing meanwhile, and it was restarted after the recovery began.
    dead = pairing["dead_replica"]
    assert dead["port_refused"] == [True, True]
    assert dead["server_attempts_while_dead"] == 0
    assert dead["answered_while_dead"] == 0
    assert dead["killed_s"] >= 0.5
    assert dead["back_s"] >= pairing["recovered_s"] >= 6.5
    # Each client process says when it took the dead replica out; an attempt refused
    # by it took it out as unreachable.
    r0, *live = pairing["replicas"]
    assert len(dead["ejected_after_s"]) == 3
    if dead["client_attempts_while_dead"]:
        assert r0["ejections"].get("unreachable", 0) >= 1, r0
    # The crash loop: crashed again after coming back, as its engine counted.
    loop = pairing["crash_loop"]
    assert loop["crashes_sent"] >= 2
    assert loop["crashes_counted"] >= 2
    assert loop["restart_loops"] >= 1
    assert loop["back_s"]  # back at least once, between two crashes
    assert loop["down_s"] > 0 and loop["client_attempts_while_down"] >= 0
    slow = pairing["slow_replica"]
    assert slow["set_s"] is not None and slow["cleared_s"] is not None
    assert {kind: s["calls"] > 0 for kind, s in pairing["sick_share"].items()} == {
        "dead": True,
        "crash_loop": True,
        "slow": True,
    }
    # The clients' records agree with the live replicas' own counts; to the dead one
    # they also hold what no server saw (refused connections).
    for replica in live:
        assert replica["client_attempts"] == replica["server_attempts"], replica
    assert r0["client_attempts"] >= r0["server_attempts"] + dead["client_attempts_while_dead"]
    assert pairing["server_attempts"] == sum(r["server_attempts"] for r in pairing["replicas"])
    states = {
        r: {s for _, _, s in segments}
        for r, segments in pairing["timeseries"]["replica_states"].items()
    }
    assert "dead" in states["0"] and "restarting" in states["1"] and "slow" in states["2"]
    assert states["3"] == {"healthy"}
    # No rate is made up for the dead replica while it had no process: a gap.
    counted = dict(pairing["timeseries"]["attempts_per_s_by_replica"]["0"])
    assert counted[3.5] is None
    assert all(
        v is not None
        for v in dict(pairing["timeseries"]["attempts_per_s_by_replica"]["3"]).values()
    )


QUOTA_TOP_LEVEL = (TOP_LEVEL - {"cold_start_s", "calibration", "patience"}) | {
    "variants",
    "clients",
    "targets",
    "demand_tokens",
    "skipped",
}
QUOTA_PAIRING = {
    "variant",
    "processes",
    "bound",
    "retry_after",
    "headers",
    "tpm",
    "rpm",
    "client",
    "client_title",
    "runs_in",
    "workers_per_process",
    "calls",
    "succeeded",
    "success_rate",
    "not_started",
    "server_requests",
    "requests_per_call_server",
    "client_attempts",
    "requests_per_call_client",
    "server_429s",
    "responses_by_status",
    "quota_admitted",
    "quota_refused_by_reason",
    "tokens_charged",
    "demand_tokens",
    "wall_s",
    "ideal_wall_s",
    "wall_over_ideal",
    "latency_p50_s",
    "latency_p99_s",
    "started_at_second_of_minute",
    "client_cpu_s",
    "errors",
    "processes_detail",
    "timeseries",
    "targets",
    "missed",
}
QUOTA_CLIENTS = ("stormguard-sync", "stormguard-async", "openai", "litellm-router+redis")


@pytest.mark.timeout(150)
def test_drill_quota_tiny_runs_each_client_on_one_key_against_the_quota(tmp_path: Path) -> None:
    out = tmp_path / "quota"
    # Threads and tasks, a peer, and LiteLLM's Router with its Redis (the drill starts a
    # redis-server of its own): what every client shares is the machinery proved here.
    done = run_drill(out, "--scenario", "quota", "--clients", ",".join(QUOTA_CLIENTS), timeout=140)

    document: dict[str, Any] = json.loads((out / "drill.json").read_text())
    assert document.keys() >= QUOTA_TOP_LEVEL, QUOTA_TOP_LEVEL - document.keys()
    assert document["scenario"] == "quota"
    assert done.stdout.startswith("scenario quota:")
    assert "targets: success >= 99.9%" in done.stdout
    assert (out / "table.md").read_text().startswith("**scenario quota:")
    ran = {p["client"] for p in document["pairings"]}
    redis_ok = shutil.which("redis-server") is not None
    assert ran == set(QUOTA_CLIENTS) - (set() if redis_ok else {"litellm-router+redis"})
    assert redis_ok or "litellm-router+redis" in document["skipped"]
    workload = document["workload"]
    demand = document["demand_tokens"]
    calls = workload["calls"]
    assert demand > workload["tpm_bound"]["tpm"]  # the batch asks for more than the bucket
    for pairing in document["pairings"]:
        assert pairing.keys() >= QUOTA_PAIRING, QUOTA_PAIRING - pairing.keys()
        assert pairing["calls"] == calls == document["logical_requests_per_pairing"]
        assert sum(p["calls"] for p in pairing["processes_detail"]) == calls
        assert len(pairing["processes_detail"]) == pairing["processes"] == 2
        assert pairing["runs_in"] == (
            "threads" if pairing["client"] == "stormguard-sync" else "tasks"
        )
        # Every request on the chat route was either charged or refused by the quota, and
        # every 429 was the quota's.
        statuses = pairing["responses_by_status"]
        assert pairing["server_requests"] == sum(statuses.values())
        assert pairing["server_429s"] == statuses.get("429", 0)
        assert pairing["server_429s"] == sum(pairing["quota_refused_by_reason"].values())
        assert pairing["quota_admitted"] == pairing["server_requests"] - pairing["server_429s"]
        assert pairing["server_requests"] >= pairing["succeeded"]
        if pairing["client_attempts"] is not None:  # the client saw what the server saw
            assert pairing["client_attempts"] == pairing["server_requests"]
        # No client beats the quota: a batch whose every call was served once took at
        # least the demand beyond the bucket at the refill rate, and was charged it.
        if pairing["succeeded"] == calls and pairing["quota_admitted"] == calls:
            assert pairing["tokens_charged"] == demand
            tpm = pairing["tpm"]
            assert pairing["wall_s"] >= (demand - tpm) / (tpm / 60)
        assert pairing["targets"].keys() == {"success", "req/call", "wall/ideal"}
        assert set(pairing["missed"]) <= pairing["targets"].keys()
        assert pairing["timeseries"]["admitted_per_s"]
