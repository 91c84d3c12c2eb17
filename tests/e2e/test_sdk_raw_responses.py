"""``.with_raw_response`` and ``.with_streaming_response`` against the reference
server, sync and async: the final response's headers beside the result, and a
streamed chat read line by line, then closed at the end of its block."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import stormguard
from tests.e2e.server_process import RunningServer, run_server

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as running:
        yield running


def test_sync_raw_and_streaming_responses(server: RunningServer) -> None:
    with stormguard.Client(
        base_url=server.base_url, model=MODEL, api_key="x", timeout=30
    ) as client:
        raw = client.chat.completions.with_raw_response.create(messages=MESSAGES, max_tokens=5)
        assert raw.status_code == 200 and raw.retries_taken == 0
        assert raw.headers["x-queue-depth"] == str(raw.server_load.queue_depth)
        completion = raw.parse()
        assert completion.usage is not None and completion.usage.completion_tokens == 5
        assert json.loads(raw.text)["id"] == completion.id

        with client.chat.completions.with_streaming_response.create(
            messages=MESSAGES, max_tokens=8, stream=True
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line]
        assert response.is_closed
        assert lines[-1] == "data: [DONE]"
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines[:-1]]
        assert "".join(d.get("content") or "" for d in deltas).strip()

        with client.models.with_streaming_response.retrieve(MODEL) as response:
            assert response.parse().id == MODEL


async def test_async_raw_and_streaming_responses(server: RunningServer) -> None:
    async with stormguard.AsyncClient(
        base_url=server.base_url, model=MODEL, api_key="x", timeout=30
    ) as client:
        raw = await client.embeddings.with_raw_response.create(input="storm")
        assert raw.status_code == 200 and len(raw.parse().data[0].embedding) > 0

        async with client.chat.completions.with_streaming_response.create(
            messages=MESSAGES, max_tokens=8, stream=True
        ) as response:
            stream = await response.parse()
            chunks = [c async for c in stream]
        assert response.is_closed and chunks[0].choices is not None

        async with client.responses.with_streaming_response.create(
            input="hi", max_output_tokens=4
        ) as response:
            assert (await response.parse()).output_text.strip()
