"""``stormguard-drill --engine vllm``: the admission-on pairings on real vLLM.

Every server is ``python -m stormguard_server --engine vllm`` (vLLM's OpenAI server
with the admission middleware) on the tiny random-weight model of docs/vllm.md,
built offline once per run. The clients ask for the sim's model name, so vLLM
serves the tiny model under that name.

What the sampler reads differs from the sim: vLLM's /metrics has its own gauges
(``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running``,
``vllm:generation_tokens_total``), and the middleware exports no Prometheus
metrics of its own but puts its load headers (``x-queue-depth`` ...) on every
response, /metrics included. They are mapped onto the drill's series names;
what has no counterpart (OOMs, restarts, server-side attempts) is left out, and
the summary reports it as not available.

Admission-off pairings are not run: the sim's admission-off server shows the
OOM-and-restart avalanche, a fault that real vLLM does not have (it queues
and preempts instead of crashing), so there is nothing of that pairing to show.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stormguard_drill.clients.drill_client import MODEL
from stormguard_drill.config import VLLM_ENGINE_ARGS, VLLM_IPC_ENV
from stormguard_drill.sampler import parse_metrics
from stormguard_drill.servers import EngineSpec

SKIP_OFF_REASON = (
    "admission-off pairings skipped on vllm: real vLLM has no OOM fault to show"
    " (it queues and preempts instead of crashing)"
)
# vLLM series -> the drill's name for the same thing.
_GAUGES = {
    "vllm:kv_cache_usage_perc": "stormguard_kv_cache_usage_ratio",  # a 0..1 ratio
    "vllm:num_requests_running": "stormguard_running_requests",
    "vllm:generation_tokens_total": "stormguard_engine_output_tokens_total",
}
# Not a drill series: generation requests that got past admission into vLLM (its HTTP
# instrumentation sits inside the middleware, so shed requests never count there).
ADMITTED = "vllm_admitted_requests_total"
# One short request when a server is healthy, before the pairing starts: the first
# request through a fresh vLLM is slower, and the middleware sets itself up on its
# first request. It is counted in ADMITTED (the summary subtracts it).
WARMUP_REQUESTS = 1
_WARMUP = {"model": MODEL, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
_GENERATION_HANDLERS = ("/v1/chat/completions", "/v1/completions")
_QUEUE_HEADER = "x-queue-depth"


def build_model(directory: Path) -> Path:
    """The tiny model, built offline (a few seconds); imported late: it needs the
    vLLM environment's transformers and tokenizers."""
    from stormguard_server.vllm.tiny_model import build_tiny_model

    return build_tiny_model(directory)


def engine_spec(model: Path) -> EngineSpec:
    """Servers of vLLM on ``model``, in their own process group, ready at /health."""
    args = (
        *VLLM_ENGINE_ARGS,
        "--model",
        str(model),
        "--served-model-name",
        MODEL,
        # One access-log line per request costs CPU the load generator needs.
        "--uvicorn-log-level",
        "warning",
    )
    return EngineSpec(
        args=args,
        ready_path="/health",
        ready_timeout_s=240.0,
        stop_grace_s=20.0,
        own_session=True,
        warmup_request=_WARMUP,
        reports_ports=False,
        ipc_env=VLLM_IPC_ENV,
    )


def parse_vllm(response: httpx.Response) -> dict[str, float]:
    """vLLM's /metrics and the middleware's load headers, as the drill's series."""
    raw = parse_metrics(response.text)
    values = {ours: raw[theirs] for theirs, ours in _GAUGES.items() if theirs in raw}
    values[ADMITTED] = _admitted(response.text)
    # The header appears once the middleware has seen its first request.
    queue = response.headers.get(_QUEUE_HEADER)
    values["stormguard_queue_depth"] = float(queue) if queue is not None else 0.0
    return values


def _admitted(text: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "http_requests":
            continue
        for sample in family.samples:
            generation = sample.labels.get("handler") in _GENERATION_HANDLERS
            if sample.name == "http_requests_total" and generation:
                total += sample.value
    return total
