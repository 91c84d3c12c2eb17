"""The real openai package, unchanged, on the reference server's embeddings, Responses
and model routes: each call parsed by openai-python itself, sync and async; and a
Responses stream cut by an engine crash, as openai-python and stormguard read it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import openai
import pytest

import stormguard
from stormguard.protocol import LOAD_HEADERS
from tests.e2e.server_process import RunningServer, run_server

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
ALIAS = "org/sim-alias"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server("--model-alias", ALIAS, "--embedding-dimensions", "256") as running:
        yield running


def test_embeddings(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    # openai-python asks for base64 unless told otherwise, and decodes it.
    default = client.embeddings.create(model=MODEL, input=["storm", "guard"])
    assert [item.index for item in default.data] == [0, 1]
    assert len(default.data[0].embedding) == 256
    assert math.isclose(sum(x * x for x in default.data[0].embedding), 1.0, rel_tol=1e-5)
    assert default.usage.prompt_tokens == default.usage.total_tokens == 2
    floats = client.embeddings.create(model=MODEL, input="storm", encoding_format="float")
    assert floats.data[0].embedding == default.data[0].embedding
    short = client.embeddings.create(model=MODEL, input=[[1, 2, 3]], dimensions=8)
    assert len(short.data[0].embedding) == 8 and short.usage.prompt_tokens == 3
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="x")
    for name in LOAD_HEADERS:
        assert name in raw.headers
    with pytest.raises(openai.BadRequestError) as too_long:
        client.embeddings.create(model=MODEL, input="word " * 3000)
    assert too_long.value.code == "context_length_exceeded"


def test_responses_plain_and_streamed(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    plain = client.responses.create(
        model=MODEL, input="tell me a story", instructions="short", max_output_tokens=6
    )
    assert plain.status == "incomplete" and plain.output_text.strip()
    assert plain.incomplete_details is not None
    assert plain.incomplete_details.reason == "max_output_tokens"
    assert plain.usage is not None and plain.usage.output_tokens == 6

    kinds: list[str] = []
    text: list[str] = []
    with client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "tell me a story"}],
        max_output_tokens=500,
        stream=True,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
            if event.type == "response.completed":
                final = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.status == "completed" and final.output_text == "".join(text)


def test_models_retrieve(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model" and model.owned_by
    assert client.models.retrieve(ALIAS).id == ALIAS  # a slash in the id
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-9")
    assert missing.value.code == "model_not_found"


def test_async_client(server: RunningServer) -> None:
    async def main() -> None:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="x", max_retries=0
        ) as client:
            embedded, answered, model = await asyncio.gather(
                client.embeddings.create(model=MODEL, input="storm"),
                client.responses.create(model=MODEL, input="hi", max_output_tokens=3),
                client.models.retrieve(MODEL),
            )
            assert len(embedded.data[0].embedding) == 256
            assert answered.usage is not None and answered.usage.output_tokens == 3
            assert model.id == MODEL
            stream = await client.responses.create(
                model=MODEL, input="hi", max_output_tokens=200, stream=True
            )
            kinds = [event.type async for event in stream]
            assert kinds[-1] == "response.completed"

    asyncio.run(main())


def test_a_responses_stream_cut_by_an_engine_crash_is_a_503() -> None:
    """The engine crashes mid-stream: the ``error`` event names the status its HTTP
    answer would have (503: the engine restarts), so the SDK raises a 503 after the
    events it delivered, and openai-python hands the event on with that code."""
    with run_server(admin=True) as crashing:
        with stormguard.Client(base_url=crashing.base_url, model=MODEL) as client:
            stream = client.responses.create(
                input="tell me a long story", max_output_tokens=1500, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            kinds: list[str] = []
            with pytest.raises(stormguard.APIStatusError) as broken:
                for event in stream:
                    kinds.append(event.type)
                    if kinds.count("response.output_text.delta") == 3:
                        assert crashing.admin_post("/admin/crash").status_code == 200
        assert broken.value.status_code == 503
        assert isinstance(broken.value, stormguard.ServiceUnavailableError)
        assert broken.value.code == "503"
        assert "engine_unavailable" in broken.value.message
        assert "crashed" in broken.value.message
        assert broken.value.attempts == 1  # content was delivered: not retried
        assert kinds[-1] == "response.output_text.delta"

        crashing.wait_ready()
        plain = openai.OpenAI(base_url=crashing.base_url, api_key="x", max_retries=0)
        events = []
        with plain.responses.create(
            model=MODEL, input="tell me a long story", max_output_tokens=1500, stream=True,
            extra_body={"ignore_eos": True},
        ) as raw:  # fmt: skip
            for event in raw:
                events.append(event)
                if len(events) == 6:
                    assert crashing.admin_post("/admin/crash").status_code == 200
        error, failed = events[-2:]
        assert error.type == "error" and error.code == "503"
        assert failed.type == "response.failed" and failed.response.status == "failed"
