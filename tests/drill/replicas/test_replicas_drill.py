"""The replicas scenario end to end (``--quick``, about a minute): three replicas with
prefix caching; affinity keyed by conversation computes fewer prefill tokens than the
default client, hedging sends at most 1.1 requests a call, every client completes
its calls. Its figures without servers: ``test_replicas_summary.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.drill]


@pytest.mark.timeout(240)
def test_replicas_quick_affinity_saves_prefill_and_hedging_stays_bounded(tmp_path: Path) -> None:
    out = tmp_path / "replicas"
    command = [sys.executable, "-m", "stormguard_drill", "--scenario", "replicas", "--quick"]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=230, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("scenario replicas:")
    assert (out / "table.md").read_text().startswith("**scenario replicas:")
    document: dict[str, Any] = json.loads((out / "drill.json").read_text())
    by = {(p["part"], p["client"]): p for p in document["pairings"]}
    assert set(by) == {
        ("affinity", "stormguard"),
        ("affinity", "stormguard-affinity"),
        ("affinity", "litellm-router"),
        ("hedging", "stormguard"),
        ("hedging", "stormguard-hedge"),
        ("hedging", "stormguard-hedge-latency"),
        ("hedging", "litellm-router"),
    }
    for pairing in by.values():  # every stormguard client completes its calls in time
        assert pairing["calls"] > 0, pairing
        if pairing["client"].startswith("stormguard"):
            assert pairing["success_rate"] == 1.0, pairing
            assert pairing["fault_errors"] == []
    # LiteLLM's Router is a peer measured beside them, not held to stormguard's claim:
    # in one fresh-clone CI run it failed 64 % of the hedging part's calls (cause not yet known).
    checks = document["targets_checked"]
    # Affinity: the replicas prefilled fewer tokens for the keyed client.
    assert checks["affinity_prefill_vs_default"]["met"] is True, checks
    default, keyed = by[("affinity", "stormguard")], by[("affinity", "stormguard-affinity")]
    assert keyed["cache_hit_rate"] > default["cache_hit_rate"]
    # Hedging: the slow window was felt (the default client's worst first token came
    # after the replica's added latency), the hedging client hedged, within its bound.
    slow_s = document["config"]["slow_ms"] / 1000
    assert by[("hedging", "stormguard")]["slow_window_ttft_p99_s"] >= slow_s
    hedged = by[("hedging", "stormguard-hedge")]
    assert hedged["hedges_sent"] >= 1
    assert checks["hedge_requests_per_call"]["met"] is True, checks
    # Its p99 against the default client's is measured and reported, not asserted:
    # with HedgePolicy()'s 5 % budget, the few calls routed to the slow replica are
    # not all hedged, on the sim as on real vLLM (docs/benchmarks.md).
    assert checks["hedge_ttft_p99_vs_default"]["value"] is not None
    assert checks["hedge_latency_requests_per_call"]["met"] is True, checks
    assert checks["hedge_latency_ttft_p99_vs_default"]["value"] is not None
