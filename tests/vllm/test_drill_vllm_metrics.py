"""The drill's reading of a vLLM server: its /metrics and the middleware's headers mapped
onto the drill's series, and the figures vLLM cannot give reported as None, not 0.

No server is started: a /metrics text of the shape vLLM 0.32 serves is enough.
"""

from __future__ import annotations

import httpx

from stormguard_drill.config import preset
from stormguard_drill.records import LogicalResult, PairingRun
from stormguard_drill.sampler import CLIENT_ATTEMPTS
from stormguard_drill.summary import summarize
from stormguard_drill.vllm import ADMITTED, WARMUP_REQUESTS, parse_vllm

METRICS = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="stormguard-sim"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="stormguard-sim"} 3.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="stormguard-sim"} 640.0
# TYPE http_requests_total counter
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 11.0
http_requests_total{handler="none",method="GET",status="4xx"} 5.0
"""


def test_parse_vllm_maps_gauges_and_the_queue_header() -> None:
    response = httpx.Response(200, text=METRICS, headers={"x-queue-depth": "4"})
    values = parse_vllm(response)
    assert values["stormguard_kv_cache_usage_ratio"] == 0.25
    assert values["stormguard_running_requests"] == 3.0
    assert values["stormguard_engine_output_tokens_total"] == 640.0
    assert values["stormguard_queue_depth"] == 4.0
    assert values[ADMITTED] == 11.0  # generation requests only, not the 404 probe
    assert "stormguard_attempts_total" not in values


def test_summary_reports_sim_only_figures_as_not_available() -> None:
    workload = preset("tiny", engine="vllm").workload
    results = [
        LogicalResult(i, "short", i * 0.1, i * 0.1 + 0.5, True, 8, i * 0.1 + 0.1, 1, None)
        for i in range(10)
    ]
    final = {**parse_vllm(httpx.Response(200, text=METRICS)), CLIENT_ATTEMPTS: 10.0}
    run = PairingRun(
        client="openai",
        admission="on",
        engine="vllm",
        results=results,
        client_attempts=10,
        samples=[(0.0, {CLIENT_ATTEMPTS: 0.0}), (2.0, final)],
        final_metrics=final,
        max_in_flight=5,
    )
    summary = summarize(run, workload, capacity_tps=1000.0)
    for key in ("oom_count", "restart_count", "oom_restart_loop_count", "gone_client_tokens"):
        assert summary[key] is None, key
    assert summary["server_attempts"] is None
    assert summary["retry_amplification_server"] is None
    assert (summary["attempts"], summary["attempts_source"]) == (10, "client")
    assert summary["retry_amplification_client"] == 1.0
    assert summary["admitted_requests"] == 11 - WARMUP_REQUESTS
    assert summary["engine_output_tokens"] == 640
    assert summary["timeseries"]["restarts"] == []
