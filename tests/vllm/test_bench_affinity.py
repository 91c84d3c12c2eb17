"""bench/bench_affinity.py's quick run against two real vLLM replicas: every turn is
served, each replica's counters add up, every client sent the same prompts, and a
derived affinity key keeps each conversation on its home replica except where the
bounded load sent a turn on. Nothing here is timed: the figures are the benchmark's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_affinity

CLIENTS = ("sg-none", "sg-derived", "litellm-lb")


@pytest.mark.timeout(900)  # two vLLM starts: ~20 s each on a quiet machine, minutes on a busy one
def test_the_quick_run_serves_every_turn_and_its_figures_add_up(
    tiny_model: str, tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    argv = ["--quick", "--model-dir", tiny_model, "--clients", ",".join(CLIENTS)]
    assert bench_affinity.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    shape = report["shape"]
    turns = shape["conversations"] * shape["turns"]
    runs = {run["client"]: run for run in report["runs"]}
    assert set(runs) == set(CLIENTS)
    for run in runs.values():
        assert (run["turns"], run["failures"]) == (turns, 0), run
        assert sum(run["requests"]) == turns, run
        assert 0 < run["computed_tokens"] < run["prompt_tokens"], run
        assert run["preempted"] == 0, run
    # The same prompts, token for token, whichever client sent them.
    assert len({run["prompt_tokens"] for run in runs.values()}) == 1
    # Each turn of a conversation went to its key's home, or past it when the home was
    # full: a turn moves only into an overflow or back out of one.
    derived = runs["sg-derived"]
    assert derived["moved_of"] == shape["conversations"] * (shape["turns"] - 1)
    assert derived["moved"] <= 2 * derived["overflows"], derived
