"""Faults on the real server: OOM crash -> cold restart -> ready, admin endpoint, and
the same long-prompt flood with admission off (OOM) and on (no OOM)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import httpx
import openai
import pytest

from stormguard.protocol import ServerLoad
from tests.e2e.conftest import ServerFactory, spec
from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

Start = ServerFactory


def long_prompt_flood_body(index: int) -> dict[str, Any]:
    # 700 prompt tokens + 10 output: three of these overflow the 2048-token test KV cache
    # (their prompts alone do), and admission lets two run at once. Each starts with
    # its own number, so no two share a block of the prefix cache.
    return {
        "model": "stormguard-sim",
        "prompt": " ".join([str(index), *["word"] * 699]),
        "max_tokens": 10,
        "ignore_eos": True,
    }


async def flood(server: RunningServer, n: int) -> list[httpx.Response | Exception]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        return await asyncio.gather(
            *(
                client.post(server.url("/v1/completions"), json=long_prompt_flood_body(i))
                for i in range(n)
            ),
            return_exceptions=True,
        )


def statuses(responses: list[httpx.Response | Exception]) -> collections.Counter[object]:
    return collections.Counter(
        r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in responses
    )


async def test_same_flood_ooms_without_admission_and_not_with_it(
    stormguard_server_factory: Start,
) -> None:
    off, on = stormguard_server_factory.together(
        spec("--admission", "off"), spec("--admission", "on", "--max-queue-wait-s", "20")
    )

    off_responses = await flood(off, 60)
    off_metrics = off.metrics()
    assert off_metrics["stormguard_engine_oom_total"] >= 1, statuses(off_responses)
    failed = [r for r in off_responses if isinstance(r, httpx.Response) and r.status_code == 503]
    assert failed, statuses(off_responses)
    # Plain engine behaviour: no load headers, no shed reasons.
    assert all(ServerLoad.from_headers(r.headers).is_empty for r in failed)

    on_responses = await flood(on, 60)
    on_metrics = on.metrics()
    assert on_metrics["stormguard_engine_oom_total"] == 0
    assert on_metrics["stormguard_engine_crashes_total"] == 0
    assert set(statuses(on_responses)) <= {200, 503}
    served = sum(isinstance(r, httpx.Response) and r.status_code == 200 for r in on_responses)
    assert served >= 40, statuses(on_responses)  # the queue absorbs the burst; few are shed


def test_oom_crash_cold_restart_then_ready(stormguard_server_factory: Start) -> None:
    server = stormguard_server_factory("--admission", "off", "--restart-s", "1.5")
    client = openai.OpenAI(base_url=server.base_url, api_key="t", max_retries=0, timeout=10)

    async def burst() -> list[httpx.Response | Exception]:
        return await flood(server, 8)

    crashed_at = time.monotonic()
    asyncio.run(burst())
    assert server.metric("stormguard_engine_oom_total") >= 1

    ready = httpx.get(server.url("/ready"))
    assert ready.status_code == 503
    assert ready.json()["state"] in {"restarting", "warming"}
    with pytest.raises(openai.InternalServerError) as during:
        client.completions.create(model="stormguard-sim", prompt="hi", max_tokens=2)
    assert during.value.status_code == 503

    took = server.wait_ready(timeout=10)
    down_for = time.monotonic() - crashed_at
    assert 1.0 <= down_for <= 4.0, down_for
    assert took <= 4.0
    assert server.metric("stormguard_engine_restarts_total") == 1
    assert server.metric("stormguard_engine_ready") == 1
    after = client.completions.create(model="stormguard-sim", prompt="hi", max_tokens=2)
    assert after.usage is not None and after.usage.completion_tokens == 2


def test_restart_loop_is_counted(stormguard_server_factory: Start) -> None:
    server = stormguard_server_factory("--admission", "off", "--restart-s", "0.5")
    asyncio.run(flood(server, 8))
    server.wait_ready()
    asyncio.run(flood(server, 8))  # right after the restart: the engine falls over again
    server.wait_ready()
    metrics = server.metrics()
    assert metrics["stormguard_engine_oom_total"] >= 2
    assert metrics["stormguard_engine_oom_restart_loops_total"] >= 1


def test_admin_endpoint_faults(stormguard_server_factory: Start) -> None:
    server = stormguard_server_factory("--restart-s", "1", admin=True)
    client = openai.OpenAI(base_url=server.base_url, api_key="t", max_retries=0, timeout=10)
    faults = server.admin_get("/admin/faults").json()
    assert faults["error_rate"] == 0 and faults["oom_crash"] is True

    # Random errors: rate 1 -> every request fails with a 500.
    assert server.admin_post("/admin/faults", {"error_rate": 1.0}).status_code == 200
    with pytest.raises(openai.InternalServerError) as injected:
        client.completions.create(model="stormguard-sim", prompt="x", max_tokens=1)
    assert injected.value.status_code == 500
    server.admin_post("/admin/faults", {"error_rate": 0.0}).raise_for_status()

    # Added latency.
    server.admin_post("/admin/faults", {"added_latency_ms": 300}).raise_for_status()
    started = time.monotonic()
    client.completions.create(model="stormguard-sim", prompt="x", max_tokens=1)
    assert time.monotonic() - started >= 0.3
    server.admin_post("/admin/faults", {"added_latency_ms": 0}).raise_for_status()

    # Stall: nothing completes until the stall ends.
    server.admin_post("/admin/stall", {"seconds": 0.5}).raise_for_status()
    started = time.monotonic()
    client.completions.create(model="stormguard-sim", prompt="x", max_tokens=1)
    assert time.monotonic() - started >= 0.4

    # Crash now, in the middle of a stream: the stream ends with an SSE error event,
    # which openai raises as an APIError after the content it already delivered.
    stream = client.completions.create(
        model="stormguard-sim", prompt="x", max_tokens=1500, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    delivered = 0
    with pytest.raises(openai.APIError) as broken:
        for _ in stream:
            delivered += 1
            if delivered == 5:
                assert server.admin_post("/admin/crash").status_code == 200
    assert 5 <= delivered < 1500
    assert "crashed" in str(broken.value)
    # /ready false with the restart reason and an honest Retry-After, then ready.
    deadline = time.monotonic() + 2
    while httpx.get(server.url("/ready")).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    ready = httpx.get(server.url("/ready"))
    assert ready.status_code == 503
    assert ready.headers["x-load-shed"] == "engine_restart"
    assert 1 <= int(ready.headers["retry-after"]) <= 2
    refused = httpx.post(
        server.url("/v1/completions"), json={"prompt": "x", "max_tokens": 1}, timeout=5
    )
    assert refused.status_code == 503
    assert refused.headers["x-load-shed"] in {"engine_restart", "warming"}
    assert float(refused.headers["retry-after-ms"]) <= 1200
    server.wait_ready(timeout=5)
    engine = server.admin_get("/admin/engine").json()
    assert engine["stats"]["crashes"] == 1 and engine["stats"]["ooms"] == 0
    assert engine["stats"]["restarts"] == 1

    # Bad admin input is a 400, not a crash.
    assert server.admin_post("/admin/faults", {"error_rate": 7}).status_code == 400
