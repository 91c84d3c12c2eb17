"""The real openai package, unchanged, against the real reference server."""

from __future__ import annotations

import httpx
import openai
import pytest

from stormguard.protocol import LOAD_HEADERS, ServerLoad
from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"


def test_sync_chat_and_completion(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=7
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 7
    assert chat.usage.prompt_tokens > 0
    assert chat.choices[0].message.content and chat.choices[0].message.content.strip()

    text = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=5)
    assert text.usage is not None and text.usage.completion_tokens == 5
    assert text.choices[0].text.strip()

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    for name in LOAD_HEADERS:
        assert name in raw.headers
    assert ServerLoad.from_headers(raw.headers).token_capacity == int(2048 * 0.9)


def test_deterministic_text_and_stop(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    messages = [{"role": "user", "content": "same prompt"}]
    one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    two = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    content = one.choices[0].message.content
    assert content == two.choices[0].message.content
    assert content is not None
    stop_word = content.split()[3]
    stopped = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, stop=[stop_word]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stop_word not in (stopped.choices[0].message.content or "")


def test_natural_eos_and_ignore_eos(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    natural = client.completions.create(model=MODEL, prompt="tell me", max_tokens=500)
    assert natural.choices[0].finish_reason == "stop"
    assert natural.usage is not None and natural.usage.completion_tokens < 500
    forced = client.completions.create(
        model=MODEL, prompt="tell me", max_tokens=150, extra_body={"ignore_eos": True}
    )
    assert forced.usage is not None and forced.usage.completion_tokens == 150


def test_sync_stream_with_usage(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_async_chat_and_stream(stormguard_server: RunningServer) -> None:
    client = openai.AsyncOpenAI(base_url=stormguard_server.base_url, api_key="t", max_retries=0)
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "async"}], max_tokens=4
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    stream = await client.completions.create(
        model=MODEL, prompt="async stream", max_tokens=5, stream=True
    )
    pieces = [chunk.choices[0].text async for chunk in stream]
    assert len("".join(pieces).split()) == 5
    await client.close()


def test_models_and_tokenize(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    models = client.models.list()
    card = models.data[0]
    assert card.id == MODEL
    assert card.model_extra is not None and card.model_extra["max_model_len"] == 2048
    tokenized = httpx.post(stormguard_server.url("/tokenize"), json={"prompt": "hello world"})
    assert tokenized.status_code == 200
    body = tokenized.json()
    assert body["count"] == len(body["tokens"]) == 2
    assert body["max_model_len"] == 2048


def test_openai_errors_map_to_its_exception_classes(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=100_000
        )
    assert too_long.value.code == "context_length_exceeded"
    assert too_long.value.response.headers["x-load-shed"] == "too_long"
    assert too_long.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


def test_health_ready_metrics(stormguard_server: RunningServer) -> None:
    assert httpx.get(stormguard_server.url("/health")).json() == {"status": "ok"}
    ready = httpx.get(stormguard_server.url("/ready"))
    assert ready.status_code == 200 and ready.json()["ready"] is True
    metrics = stormguard_server.metrics()
    assert metrics["stormguard_engine_ready"] == 1.0
    assert metrics["stormguard_token_capacity"] == int(2048 * 0.9)
    assert metrics['stormguard_attempts_total{attempt="1"}'] >= 1
