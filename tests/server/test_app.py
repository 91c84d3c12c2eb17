"""The HTTP app in process: bad input is always a 4xx with an OpenAI-style body, load
headers are on every response, and admission off sends none."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from stormguard.protocol import LOAD_HEADERS
from tests.server.conftest import AppClient
from tests.server.fake_clock import FakeClock

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    for name in LOAD_HEADERS:
        assert name in response.headers
    return dict(error)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, None),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**30}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}, None),
        ([1, 2, 3], None),
        ("just a string", None),
        (None, None),
    ],
)
async def test_wrong_types_are_400(client: httpx.AsyncClient, body: Any, param: str | None) -> None:
    error = assert_openai_error(await client.post(CHAT, json=body), 400)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param)


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"prompt": "x",}', b"\xff\xfe\x00garbage", b'{"prompt": "\xff"}', b"", b"null"],
)
async def test_malformed_or_non_utf8_bodies_are_400(client: httpx.AsyncClient, raw: bytes) -> None:
    response = await client.post(
        COMPLETIONS, content=raw, headers={"content-type": "application/json"}
    )
    assert_openai_error(response, 400)


async def test_huge_max_tokens_is_too_long(client: httpx.AsyncClient) -> None:
    response = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 10**6})
    error = assert_openai_error(response, 400)
    assert error["code"] == "context_length_exceeded"
    assert response.headers["x-load-shed"] == "too_long"
    assert response.headers["x-should-retry"] == "false"


async def test_body_over_the_limit_is_413(make_client: AppClient) -> None:
    async with make_client(max_body_bytes=1000) as client:
        big = {"prompt": "x" * 2000, "max_tokens": 1}
        assert_openai_error(await client.post(COMPLETIONS, json=big), 413)

        async def chunks() -> Any:
            for _ in range(5):
                yield b" " * 400  # no content-length: counted while read

        response = await client.post(
            COMPLETIONS, content=chunks(), headers={"content-type": "application/json"}
        )
        assert_openai_error(response, 413)
        # Still serving.
        assert (
            await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1})
        ).status_code == 200


async def test_unknown_route_method_and_model(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/v1/nothing"), 404)
    assert_openai_error(await client.get(CHAT), 405)
    error = assert_openai_error(
        await client.post(COMPLETIONS, json={"model": "gpt-9", "prompt": "x"}), 404
    )
    assert error["code"] == "model_not_found"
    assert_openai_error(await client.get("/v1/models/gpt-9"), 404)


async def test_non_json_content_type_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        COMPLETIONS, content=b"prompt=x", headers={"content-type": "text/plain"}
    )
    assert_openai_error(response, 400)


async def test_load_headers_on_success_stream_and_metrics(client: httpx.AsyncClient) -> None:
    for response in (
        await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2}),
        await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2, "stream": True}),
        await client.get("/metrics"),
        await client.get("/health"),
    ):
        assert response.status_code == 200
        for name in LOAD_HEADERS:
            assert name in response.headers, (response.url, name)


async def test_admission_off_sends_no_load_headers(make_client: AppClient) -> None:
    async with make_client(admission=False) as client:
        ok = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2})
        too_long = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 10**6})
        for response in (ok, too_long):
            assert not any(name in response.headers for name in LOAD_HEADERS)
            assert "x-load-shed" not in response.headers
        assert ok.status_code == 200 and too_long.status_code == 400


async def test_max_completion_tokens_and_content_parts(client: httpx.AsyncClient) -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "max_completion_tokens": 3,
        "temperature": 0.7,
        "seed": 1,
    }
    response = await client.post(CHAT, json=body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3


async def test_default_max_tokens_fills_the_context(make_client: AppClient) -> None:
    clock = FakeClock()  # some 500 engine steps, in virtual time
    async with make_client(clock=clock) as client:
        call = client.post(COMPLETIONS, json={"prompt": "x", "ignore_eos": True})
        usage = (await clock.drive(call)).json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512


async def test_tokenize_messages_and_errors(client: httpx.AsyncClient) -> None:
    chat = await client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.json()["count"] > 1
    assert_openai_error(await client.post("/tokenize", json={}), 400)


async def test_ready_reports_restart_with_retry_after(make_client: AppClient) -> None:
    clock = FakeClock()
    async with make_client(clock=clock) as client:
        state = client.app.state.stormguard  # type: ignore[attr-defined]
        state.faults.request_crash()
        await clock.run_until(lambda: state.engine.load().state == "restarting")
        response = await client.get("/ready")
        assert response.status_code == 503
        assert response.json()["state"] == "restarting"
        assert response.headers["x-load-shed"] == "engine_restart"
        assert response.headers["retry-after"] == "1"  # 0.2 s cold restart, rounded up
        shed = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1})
        assert_openai_error(shed, 503)
        assert shed.headers["x-load-shed"] == "engine_restart"
        crashed_at = clock.now()
        await clock.run_until(lambda: state.engine.load().ready)
        assert clock.now() - crashed_at >= 0.2  # cold for restart_s
        assert (await client.get("/ready")).status_code == 200


async def test_a_bug_becomes_an_openai_500_with_load_headers(client: httpx.AsyncClient) -> None:
    app = client.app  # type: ignore[attr-defined]

    def broken(text: str) -> list[int]:
        raise RuntimeError("boom")

    app.state.stormguard.engine.encode = broken
    response = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1})
    error = assert_openai_error(response, 500)
    assert error["code"] == "internal_error" and "boom" not in error["message"]
    # The error boundary's 500 is counted like any other answer.
    registry = app.state.stormguard.metrics.registry
    labels = {"route": COMPLETIONS, "status": "500"}
    assert registry.get_sample_value("stormguard_responses_total", labels) == 1


class Recorder:
    def __init__(self) -> None:
        self.arrived: list[Any] = []
        self.done: list[Any] = []

    def request_arrived(self, record: Any) -> None:
        self.arrived.append(record)

    def request_done(self, record: Any) -> None:
        self.done.append(record)


async def test_observers_get_each_request_record(client: httpx.AsyncClient) -> None:
    recorder = Recorder()
    client.app.state.stormguard.observers.append(recorder)  # type: ignore[attr-defined]
    ok = await client.post(
        COMPLETIONS,
        json={"prompt": "x", "max_tokens": 3},
        headers={"x-stormguard-attempt": "2", "x-priority": "critical"},
    )
    streamed = await client.post(COMPLETIONS, json={"prompt": "y", "max_tokens": 2, "stream": True})
    shed = await client.post(
        COMPLETIONS, json={"prompt": "z", "max_tokens": 1}, headers={"x-request-deadline-ms": "0"}
    )
    assert (ok.status_code, streamed.status_code, shed.status_code) == (200, 200, 503)
    assert len(recorder.arrived) == 3
    first, second, third = recorder.done
    assert first.outcome == "ok" and first.attempt == 2 and first.priority.value == "critical"
    assert first.output_tokens == 3 and first.finish_reason == "length"
    assert first.cost == 16  # 1 + 3 tokens, in whole 16-token blocks
    assert first.queue_wait_s is not None and first.ttft_s is not None
    assert first.latency_s is not None and first.latency_s >= first.ttft_s
    assert second.outcome == "ok" and second.output_tokens == 2
    assert third.outcome == "shed" and third.shed_reason.value == "deadline"
    assert not third.started


async def test_engine_crash_mid_stream_is_a_vllm_style_error_event(
    make_client: AppClient,
) -> None:
    clock = FakeClock()
    async with make_client(clock=clock) as client:
        state = client.app.state.stormguard  # type: ignore[attr-defined]
        body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
        before = state.engine.stats.output_tokens  # the warm-up probe's
        task = asyncio.create_task(client.post(COMPLETIONS, json=body))
        await clock.run_until(lambda: state.engine.stats.output_tokens > before + 3)
        state.faults.request_crash()
        response = await clock.drive(task)
    assert response.status_code == 200
    events = [line[len("data: ") :] for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503 and "crashed" in error["message"]
    assert all("choices" in json.loads(e) for e in events[:-2])
    assert len(events) > 3


async def test_generation_answers_carry_the_request_id(client: httpx.AsyncClient) -> None:
    ok = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1})
    assert ok.headers["x-request-id"] == ok.json()["id"]
    streamed = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1, "stream": True})
    assert streamed.headers["x-request-id"].startswith("cmpl-")
    assert streamed.headers["x-request-id"] in streamed.text
    shed = await client.post(
        CHAT,
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
        headers={"x-request-deadline-ms": "0"},
    )
    assert shed.status_code == 503 and shed.headers["x-request-id"].startswith("chatcmpl-")


async def test_every_other_answer_carries_a_request_id_of_its_own(
    make_client: AppClient,
) -> None:
    """An unknown route's 404 (and every answer that is no generation) names itself too,
    so a caller can quote an id for a failed request (openai's ``exc.request_id``)."""
    async with make_client(max_body_bytes=1000) as client:
        answers = [
            await client.get("/v1/nothing"),
            await client.post("/v1/nothing", json={}),
            await client.get(CHAT),
            await client.post(COMPLETIONS, json={"model": "gpt-9", "prompt": "x"}),
            await client.get("/v1/models/gpt-9"),
            await client.post(CHAT, json={"messages": []}),
            await client.post(COMPLETIONS, json={"prompt": "x" * 2000}),
            await client.get("/v1/models"),
            await client.get("/health"),
        ]
        assert [r.status_code for r in answers] == [404, 404, 405, 404, 404, 400, 413, 200, 200]
        ids = [r.headers.get_list("x-request-id") for r in answers]
        assert all(len(one) == 1 and one[0].startswith("req-") for one in ids), ids
        assert len({one[0] for one in ids}) == len(ids)
        # A generation keeps its own id: one header, the completion's.
        ok = await client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1})
        assert ok.headers.get_list("x-request-id") == [ok.json()["id"]]
