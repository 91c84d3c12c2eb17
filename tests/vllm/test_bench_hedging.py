"""bench/bench_hedging.py's quick run against two real vLLM replicas, one flooded with
long prefills: every call is served, the flood reached its replica, the replicas'
counters add up to the calls (and the hedges), and no hedging client sends more than
one hedge per call. Nothing here is timed: the figures are the benchmark's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_hedging


@pytest.mark.timeout(900)  # two vLLM starts: ~20 s each on a quiet machine, minutes on a busy one
def test_the_quick_run_serves_every_call_and_its_figures_add_up(
    tiny_model: str, tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    argv = ["--quick", "--model-dir", tiny_model, "--fixed-delay", "0.2"]
    assert bench_hedging.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    calls = report["shape"]["calls"]
    runs = {run["client"]: run for run in report["runs"]}
    assert set(runs) == set(bench_hedging.CLIENTS)
    for run in runs.values():
        assert (run["calls"], run["failures"]) == (calls, 0), run
        assert run["flood_requests"] > 0 and run["flood_failures"] == 0, run
        assert run["used_tokens"] > 0, run
        # Every call reached a replica; a hedge is one more request, never two.
        sent = run["hedges_sent"] or 0
        assert calls <= sum(run["requests"]) - run["flood_requests"] <= calls + sent, run
    assert runs["sg-default"]["hedges_sent"] == 0
    for name in bench_hedging.HEDGE_CLIENTS:
        assert runs[name]["hedges_won"] <= runs[name]["hedges_sent"] <= calls, runs[name]
