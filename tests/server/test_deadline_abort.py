"""A request whose x-request-deadline-ms passes while it runs is aborted by the engine at
its next step: a 504 for a plain call, an error event for a stream that has started,
its KV blocks freed and the abort counted. The engine's clock is the test's, so the
deadline passes when the test says, not when a busy machine gets round to it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, ServerConfig
from stormguard_server.sim_engine import SimEngine
from stormguard_server.state import ServerState
from tests.server.conftest import FAST_ENGINE

COMPLETIONS = "/v1/completions"
# Generates for far longer than the test runs unless it is aborted.
LONG = {"prompt": "x", "max_tokens": 400, "ignore_eos": True}
DEADLINE = {"x-request-deadline-ms": "60000"}


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@dataclasses.dataclass
class Server:
    client: httpx.AsyncClient
    engine: SimEngine
    state: ServerState

    def metric(self, name: str) -> float | None:
        value: float | None = self.state.metrics.registry.get_sample_value(name)
        return value


@pytest.fixture(params=[True, False], ids=["admission", "no-admission"])
async def server(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Server]:
    config = ServerConfig(engine=FAST_ENGINE, admission=AdmissionConfig(enabled=request.param))
    engine = SimEngine(config.engine, clock=clock)
    state = build_state(config, engine=engine)
    app = create_app(state=state)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield Server(client, engine, state)


async def past_the_deadline_once_running(engine: SimEngine, clock: ManualClock) -> None:
    """Wait until the request has tokens out, then move the clock past its deadline."""
    before = engine.stats.output_tokens
    for _ in range(5000):
        if engine.stats.output_tokens >= before + 3:
            break
        await asyncio.sleep(0.002)
    else:
        raise AssertionError("the request never started generating")
    clock.now += 60.0


async def test_a_plain_call_past_its_deadline_gets_a_504_and_frees_the_engine(
    server: Server, clock: ManualClock
) -> None:
    client, engine = server.client, server.engine
    call = asyncio.create_task(client.post(COMPLETIONS, json=LONG, headers=DEADLINE))
    await past_the_deadline_once_running(engine, clock)
    response = await call
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "timeout"
    assert "deadline passed" in error["message"]
    admission = server.state.admission is not None
    assert response.headers.get("x-should-retry") == ("false" if admission else None)
    assert "x-load-shed" not in response.headers  # not a shed: the engine worked on it
    assert engine.load().running == 0 and engine.load().kv_cache_usage == 0
    assert server.metric("stormguard_engine_requests_deadline_exceeded_total") == 1
    assert server.metric("stormguard_inflight_tokens") == 0  # its permit went back


async def test_a_stream_past_its_deadline_ends_with_an_error_event(
    server: Server, clock: ManualClock
) -> None:
    client, engine = server.client, server.engine
    body = {**LONG, "stream": True}
    call = asyncio.create_task(client.post(COMPLETIONS, json=body, headers=DEADLINE))
    await past_the_deadline_once_running(engine, clock)
    response = await call
    assert response.status_code == 200  # the stream had started
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 504 and error["type"] == "timeout"
    assert all("choices" in json.loads(e) for e in events[:-2])
    assert 3 <= len(events) - 2 < 400
    assert engine.load().kv_cache_usage == 0
    assert engine.stats.requests_deadline_exceeded == 1


async def test_a_call_within_its_deadline_is_not_touched(server: Server) -> None:
    client, engine = server.client, server.engine
    body = {"prompt": "x", "max_tokens": 5, "ignore_eos": True}
    response = await client.post(COMPLETIONS, json=body, headers=DEADLINE)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 5
    assert engine.stats.requests_deadline_exceeded == 0
