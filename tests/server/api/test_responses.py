"""POST /v1/responses in process: the ``response`` object and the stream's events, each
validated by openai-python's own pydantic types (validation, not construction);
the event order and sequence numbers; an engine crash mid-stream ending in ``error``
and ``response.failed``; openai's 400s; admission's too_long and deadline refusals."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from stormguard.protocol import LOAD_HEADERS
from stormguard_server.app import build_state, create_app
from stormguard_server.config import ServerConfig
from stormguard_server.state import ServerState
from stormguard_server.telemetry.records import RequestRecord
from tests.server.conftest import FAST_ENGINE
from tests.server.fake_clock import FakeClock
from tests.server.test_app import assert_openai_error

RESPONSES = "/v1/responses"
EVENT = TypeAdapter[Any](ResponseStreamEvent)
OPENING = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


class Records:
    def __init__(self) -> None:
        self.done: list[RequestRecord] = []

    def request_arrived(self, record: RequestRecord) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        self.done.append(record)


@dataclasses.dataclass
class Served:
    client: httpx.AsyncClient
    state: ServerState
    records: Records


async def serve(clock: FakeClock | None = None, **engine: Any) -> AsyncIterator[Served]:
    config = ServerConfig(engine=dataclasses.replace(FAST_ENGINE, **engine))
    state = build_state(config, clock=clock)
    records = Records()
    state.observers.append(records)
    app = create_app(state=state)
    if clock is not None:  # warm-up on the fake clock; the lifespan finds it started
        await clock.drive(state.engine.start())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield Served(client, state, records)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async for one in serve():
        yield one


def events_of(body: str) -> list[dict[str, Any]]:
    """Each SSE event's data, checked against its ``event:`` line and openai's types."""
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        EVENT.validate_python(data)
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


async def tokens_of(client: httpx.AsyncClient, messages: list[dict[str, str]]) -> int:
    tokenized = await client.post("/tokenize", json={"messages": messages})
    return int(tokenized.json()["count"])


async def test_a_completed_response(served: Served) -> None:
    response = await served.client.post(
        RESPONSES,
        json={
            "model": "stormguard-sim",
            "input": "tell me about storms",
            "instructions": "be brief",
            "max_output_tokens": 400,
            "temperature": 0.5,
        },
    )
    assert response.status_code == 200, response.text
    for name in LOAD_HEADERS:
        assert name in response.headers
    parsed = OpenAIResponse.model_validate(response.json())
    assert parsed.status == "completed" and parsed.incomplete_details is None
    assert parsed.id == response.headers["x-request-id"] and parsed.id.startswith("resp-")
    assert parsed.model == "stormguard-sim" and parsed.instructions == "be brief"
    assert parsed.temperature == 0.5 and parsed.max_output_tokens == 400
    assert parsed.output_text.strip()
    [message] = parsed.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed"
    expected_input = await tokens_of(
        served.client,
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "tell me about storms"},
        ],
    )
    assert parsed.usage is not None
    assert parsed.usage.input_tokens == expected_input
    assert 0 < parsed.usage.output_tokens < 400
    assert parsed.usage.total_tokens == expected_input + parsed.usage.output_tokens


async def test_cut_at_max_output_tokens_is_incomplete(served: Served) -> None:
    body = {
        "input": [
            {"role": "user", "content": "first"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "then"}]},
        ],
        "max_output_tokens": 3,
    }
    response = await served.client.post(RESPONSES, json=body)
    parsed = OpenAIResponse.model_validate(response.json())
    assert parsed.status == "incomplete"
    assert parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.usage is not None and parsed.usage.output_tokens == 3
    [record] = [r for r in served.records.done if r.kind == "response"]
    assert record.outcome == "ok" and record.max_tokens == 3
    assert record.cost == -(-(record.prompt_tokens + 3) // 16) * 16


@pytest.mark.parametrize(
    ("max_output_tokens", "last"), [(5, "response.incomplete"), (400, "response.completed")]
)
async def test_stream_events_in_openai_order(
    served: Served, max_output_tokens: int, last: str
) -> None:
    response = await served.client.post(
        RESPONSES, json={"input": "hi", "max_output_tokens": max_output_tokens, "stream": True}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    for name in LOAD_HEADERS:
        assert name in response.headers
    events = events_of(response.text)
    kinds = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert kinds == [*OPENING, *["response.output_text.delta"] * len(deltas), *CLOSING, last]
    text = "".join(e["delta"] for e in deltas)
    assert text and events[-4]["text"] == text
    final = OpenAIResponse.model_validate(events[-1]["response"])
    assert final.output_text == text and final.id == events[0]["response"]["id"]
    assert final.usage is not None
    assert (final.usage.output_tokens == 5) == (last == "response.incomplete")
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == [] and events[0]["response"]["usage"] is None
    item_id = events[2]["item"]["id"]
    assert all(e.get("item_id", item_id) == item_id for e in events[3:-1])


async def test_an_engine_crash_mid_stream_ends_in_error_and_response_failed() -> None:
    """The app is driven at the ASGI level (httpx's ASGI transport hands over a body only
    when it is complete): the engine crashes when the first delta is sent."""
    config = ServerConfig(engine=FAST_ENGINE)
    state = build_state(config)
    records = Records()
    state.observers.append(records)
    app = create_app(state=state)
    faults = state.faults
    assert faults is not None
    body = {"input": "hi", "max_output_tokens": 400, "ignore_eos": True, "stream": True}
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": RESPONSES,
        "raw_path": RESPONSES.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    ended = asyncio.Event()
    sent: list[bytes] = []
    delivered = sent_a_delta = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent_a_delta
        if message["type"] != "http.response.body":
            return
        chunk = message.get("body", b"")
        if b"response.output_text.delta" in chunk and not sent_a_delta:
            sent_a_delta = True
            faults.request_crash()  # taken at the engine's next step
        sent.append(chunk)
        if not message.get("more_body", False):
            ended.set()

    async with app.router.lifespan_context(app):
        await asyncio.wait_for(app(scope, receive, send), 30)  # type: ignore[arg-type]
    events = events_of(b"".join(sent).decode())
    kinds = [e["type"] for e in events]
    assert kinds[: len(OPENING)] == OPENING
    assert [k for k in kinds[len(OPENING) :] if k != "response.output_text.delta"] == [
        "error",
        "response.failed",
    ]
    # The code is the status a client reads (503: the engine restarts), the reason leads
    # the message.
    assert events[-2]["code"] == "503"
    assert events[-2]["message"].startswith("engine_unavailable: ")
    assert "crashed" in events[-2]["message"]
    failed = OpenAIResponse.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error"
    [record] = [r for r in records.done if r.kind == "response"]
    assert record.outcome == "engine_error" and record.output_tokens < 400


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"model": "stormguard-sim"}, "input"),
        ({"input": 5}, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
        ),
        ({"input": [{"role": "", "content": "x"}]}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "stream": "yes"}, "stream"),
    ],
)
async def test_bad_input_is_an_openai_400(served: Served, body: Any, param: str) -> None:
    error = assert_openai_error(await served.client.post(RESPONSES, json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param)


async def test_too_long_unknown_model_and_passed_deadline(served: Served) -> None:
    client = served.client
    response = await client.post(RESPONSES, json={"input": "x " * 600})
    error = assert_openai_error(response, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert response.headers["x-load-shed"] == "too_long"
    error = assert_openai_error(
        await client.post(RESPONSES, json={"model": "gpt-9", "input": "x"}), 404
    )
    assert error["code"] == "model_not_found"
    started = served.state.engine.stats.requests_started
    response = await client.post(
        RESPONSES, json={"input": "x", "stream": True}, headers={"x-request-deadline-ms": "0"}
    )
    assert_openai_error(response, 503)
    assert response.headers["x-load-shed"] == "deadline"
    assert served.state.engine.stats.requests_started == started


async def test_a_deadline_that_passes_in_the_engine_is_a_504() -> None:
    clock = FakeClock()
    async for served in serve(clock):
        faults = served.state.faults
        assert faults is not None
        faults.stall(600)  # no step runs until the deadline has passed
        call = served.client.post(
            RESPONSES, json={"input": "x"}, headers={"x-request-deadline-ms": "300"}
        )
        start = clock.now()
        response = await clock.drive(call)
        assert clock.now() - start == pytest.approx(0.3, abs=0.05)  # the stalled loop polls
        faults.stall(0)
        assert assert_openai_error(response, 504)["code"] == "deadline_exceeded"
        assert served.state.engine.load().kv_cache_usage == 0.0
