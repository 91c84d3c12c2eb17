"""A request whose x-request-deadline-ms passes while it runs is aborted by the engine at
its next step: a 504 for a plain call, an error event for a stream that has started,
its KV blocks freed and the abort counted. The server runs on a fake clock, so the
deadline passes at its virtual time, not when a busy machine gets round to it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, ServerConfig
from stormguard_server.engine.sim_engine import SimEngine
from stormguard_server.state import ServerState
from tests.server.conftest import FAST_ENGINE
from tests.server.fake_clock import FakeClock

COMPLETIONS = "/v1/completions"
# Steps of 10 ms: 400 tokens take 4 s, far past the 1 s deadline unless aborted.
ENGINE = dataclasses.replace(FAST_ENGINE, step_base_s=0.01)
LONG = {"prompt": "x", "max_tokens": 400, "ignore_eos": True}
DEADLINE_S = 1.0
DEADLINE = {"x-request-deadline-ms": str(int(DEADLINE_S * 1000))}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@dataclasses.dataclass
class Server:
    client: httpx.AsyncClient
    engine: SimEngine
    state: ServerState

    def metric(self, name: str) -> float | None:
        value: float | None = self.state.metrics.registry.get_sample_value(name)
        return value


@pytest.fixture(params=[True, False], ids=["admission", "no-admission"])
async def server(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Server]:
    config = ServerConfig(engine=ENGINE, admission=AdmissionConfig(enabled=request.param))
    state = build_state(config, clock=clock)
    assert isinstance(state.engine, SimEngine)
    engine = state.engine
    app = create_app(state=state)
    await clock.drive(engine.start())  # warm-up on the clock; the lifespan finds it started
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield Server(client, engine, state)


async def test_a_plain_call_past_its_deadline_gets_a_504_and_frees_the_engine(
    server: Server, clock: FakeClock
) -> None:
    client, engine = server.client, server.engine
    start = clock.now()
    response = await clock.drive(client.post(COMPLETIONS, json=LONG, headers=DEADLINE))
    # Answered at the engine's first step past the deadline, not at the end of its work.
    assert clock.now() - start == pytest.approx(DEADLINE_S, abs=2 * ENGINE.step_base_s)
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "timeout"
    assert "deadline passed" in error["message"]
    admission = server.state.admission is not None
    assert response.headers.get("x-should-retry") == ("false" if admission else None)
    assert "x-load-shed" not in response.headers  # not a shed: the engine worked on it
    assert engine.load().running == 0 and engine.load().kv_cache_usage == 0
    assert server.metric("stormguard_engine_requests_deadline_exceeded_total") == 1
    assert server.metric("stormguard_inflight_tokens") == 0  # its grant went back


async def test_a_stream_past_its_deadline_ends_with_an_error_event(
    server: Server, clock: FakeClock
) -> None:
    client, engine = server.client, server.engine
    body = {**LONG, "stream": True}
    start = clock.now()
    response = await clock.drive(client.post(COMPLETIONS, json=body, headers=DEADLINE))
    assert clock.now() - start == pytest.approx(DEADLINE_S, abs=2 * ENGINE.step_base_s)
    assert response.status_code == 200  # the stream had started
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 504 and error["type"] == "timeout"
    assert all("choices" in json.loads(e) for e in events[:-2])
    assert 3 <= len(events) - 2 < 400
    assert engine.load().kv_cache_usage == 0
    assert engine.stats.requests_deadline_exceeded == 1


async def test_a_call_within_its_deadline_is_not_touched(server: Server, clock: FakeClock) -> None:
    client, engine = server.client, server.engine
    body = {"prompt": "x", "max_tokens": 90, "ignore_eos": True}  # 0.9 s of its 1 s
    response = await clock.drive(client.post(COMPLETIONS, json=body, headers=DEADLINE))
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 90
    assert engine.stats.requests_deadline_exceeded == 0
