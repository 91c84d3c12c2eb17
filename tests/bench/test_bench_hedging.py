"""bench/bench_hedging.py without vLLM: its workload, its driver and its arithmetic.

The figures are only as good as these: every client must send the same prompts, the
flood must fall in the middle third of the run, the driver must keep its rate and its
bound on calls in flight, and the attempts, loser-token and target figures must be the
arithmetic the docs state (the flood's requests and tokens are not the client's).
"""

from __future__ import annotations

import asyncio

import pytest

import bench_hedging as bh

SHAPE = bh.Shape(calls=12, prompt_words=5)

METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 980.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 9054.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 60.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 3.0
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 66.0
http_requests_total{handler="/v1/models",method="GET",status="2xx"} 4.0
"""


def test_every_client_of_a_round_sends_the_same_prompts_and_another_round_others() -> None:
    assert bh.prompts(SHAPE, 7) == bh.prompts(SHAPE, 7)
    assert bh.prompts(SHAPE, 7) != bh.prompts(SHAPE, 8)
    texts = bh.prompts(SHAPE, 7)
    assert len(texts) == 12 == len(set(texts))
    assert all(len(t.split()) == 2 + 5 for t in texts)  # "call N:" and its words


def test_the_counters_read_generated_tokens_and_the_chat_requests_the_http_server_saw() -> None:
    assert bh.counters(METRICS) == {
        "generated": 980.0,
        "requests": 66.0,
        "finished": 65.0,
        "aborted": 3.0,
        "prompt": 9054.0,
    }


def test_the_flood_runs_in_the_middle_third_of_the_run() -> None:
    assert bh.flood_window(240, 6.0) == pytest.approx((40 / 3, 80 / 3))


def _run(**counts: float) -> bh.Run:
    run = bh.Run(client="sg-hedge", round=0, seed=1, calls=100)
    base = {"generated": 0.0, "requests": 0.0, "finished": 0.0, "aborted": 0.0, "prompt": 0.0}
    run.replicas = [{**base, **counts}, dict(base)]
    return run


def test_attempts_and_loser_tokens_leave_out_the_flood() -> None:
    # 100 calls of 16 tokens used; the replicas counted 110 requests (6 of them the
    # flood's, 1 token each) and 1,700 tokens generated: 4 hedges, 94 tokens on losers.
    run = _run(generated=1700.0, requests=110.0)
    run.used_tokens, run.flood_requests, run.flood_tokens = 1600, 6, 6
    figures = run.figures(None)
    assert figures["attempts_per_call"] == pytest.approx(1.04)
    assert figures["generated"] == 1694.0
    assert figures["loser_tokens"] == 94.0
    assert figures["loser_share"] == pytest.approx(94 / 1694)


def test_the_p99_ratio_is_against_the_baseline_of_the_same_round() -> None:
    baseline, hedged = _run(), _run()
    baseline.ttfts = [0.1] * 98 + [2.0, 2.0]
    hedged.ttfts = [0.1] * 98 + [0.5, 0.5]
    assert hedged.figures(baseline)["p99_ratio"] == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("ratio", "attempts", "share", "met"),
    [
        (0.5, 1.05, 0.02, (True, True, True)),
        (0.51, 1.06, 0.021, (False, False, False)),
        (None, None, None, (None, None, None)),
    ],
)
def test_the_targets_are_met_at_their_bounds_and_missed_past_them(
    ratio: float | None, attempts: float | None, share: float | None, met: tuple[bool | None, ...]
) -> None:
    figures = {"p99_ratio": ratio, "attempts_per_call": attempts, "loser_share": share}
    assert tuple(bh.verdicts(figures).values()) == met


def test_no_calls_or_no_tokens_give_no_figure_rather_than_a_division_by_zero() -> None:
    assert bh.attempts_per_call(5, 0) is None
    assert bh.attempts_per_call(None, 5) is None
    assert bh.loser_share(0, 0) is None
    assert bh.loser_share(100, 120) == 0.0  # usage counted past the engine's: no negative


def test_the_driver_keeps_its_bound_in_flight_and_counts_each_failure() -> None:
    running = peak = 0
    gate = asyncio.Event()

    async def call(text: str) -> tuple[float | None, int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            gate.set()
        await gate.wait()
        running -= 1
        if text == "bad":
            raise RuntimeError("refused")
        if text == "empty":
            return None, 0
        return 0.01, 16

    run = bh.Run(client="x", round=0, seed=1)
    texts = ["a", "bad", "b", "empty", "c", "d"]
    asyncio.run(bh.drive(call, texts, rate=1000.0, in_flight=3, run=run))
    assert peak == 3
    assert (run.calls, run.failures, len(run.ttfts), run.used_tokens) == (6, 2, 4, 64)
    assert run.errors == ["RuntimeError: refused", "a stream without a chunk"]


def test_each_stormguard_client_has_its_options() -> None:
    from stormguard import HedgePolicy, LatencyRouting

    options = {name: bh.sg_options(name, 0.3) for name in bh.CLIENTS if name.startswith("sg-")}
    assert options["sg-default"] == {"hedge": None, "latency_routing": None}
    assert options["sg-hedge"] == {"hedge": HedgePolicy(), "latency_routing": None}
    assert options["sg-hedge-fixed"]["hedge"] == HedgePolicy(delay=0.3)
    assert options["sg-ewma"] == {"hedge": None, "latency_routing": LatencyRouting()}
    assert options["sg-ewma-hedge"] == {
        "hedge": HedgePolicy(),
        "latency_routing": LatencyRouting(),
    }
    assert set(bh.HEDGE_CLIENTS) == set(options) - {bh.BASELINE}
