"""stormguard's embeddings, responses (JSON and streamed) and models.retrieve against
the reference server, sync and async, and the same calls through
``openai.OpenAI(http_client=stormguard.httpx_client(...), max_retries=0)``."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest

import stormguard
from tests.e2e.server_process import RunningServer, run_server

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
ALIAS = "org/sim-alias"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server("--model-alias", ALIAS, "--embedding-dimensions", "64") as running:
        yield running


def test_sync_client(server: RunningServer) -> None:
    with stormguard.Client(
        base_url=server.base_url, model=MODEL, api_key="x", timeout=30
    ) as client:
        vectors = client.embeddings.create(input=["storm", "guard"])
        assert [len(d.embedding) for d in vectors.data] == [64, 64]
        assert math.isclose(sum(x * x for x in vectors.data[0].embedding), 1.0, rel_tol=1e-5)
        floats = client.embeddings.create(input="storm", encoding_format="float")
        assert floats.data[0].embedding == vectors.data[0].embedding
        assert vectors.server_load.queue_depth is not None and vectors.attempts == 1

        plain = client.responses.create(input="tell me a story", max_output_tokens=6)
        assert plain.status == "incomplete" and plain.output_text.strip()
        assert plain.usage is not None and plain.usage.output_tokens == 6

        with client.responses.create(
            input=[{"role": "user", "content": "tell me a story"}],
            instructions="short",
            max_output_tokens=40,
            stream=True,
        ) as stream:
            got = list(stream)
        assert got[0].type == "response.created"
        assert got[-1].type in ("response.completed", "response.incomplete")
        deltas = "".join(e.delta for e in got if e.type == "response.output_text.delta")
        assert deltas == got[-1].response.output_text

        assert client.models.retrieve(ALIAS).id == ALIAS
        with pytest.raises(stormguard.NotFoundError):
            client.models.retrieve("no-such-model")


async def test_async_client(server: RunningServer) -> None:
    async with stormguard.AsyncClient(
        base_url=server.base_url, model=MODEL, api_key="x", timeout=30
    ) as client:
        vectors = await client.embeddings.create(input=[[1, 2, 3]], dimensions=8)
        assert len(vectors.data[0].embedding) == 8 and vectors.usage.prompt_tokens == 3
        plain = await client.responses.create(input="hi", max_output_tokens=4)
        assert plain.output_text.strip()
        stream = await client.responses.create(input="hi", max_output_tokens=8, stream=True)
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1].startswith("response.")
        assert "response.output_text.delta" in kinds
        assert (await client.models.retrieve(MODEL)).id == MODEL


def test_openai_through_the_transport(server: RunningServer) -> None:
    http = stormguard.httpx_client(base_url=server.base_url, timeout=30)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", http_client=http, max_retries=0)
    try:
        vectors = client.embeddings.create(model=MODEL, input=["storm"])
        assert len(vectors.data[0].embedding) == 64
        plain = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
        assert plain.output_text.strip()
        with client.responses.create(
            model=MODEL, input="tell me a story", max_output_tokens=20, stream=True
        ) as stream:
            kinds = [event.type for event in stream]
        assert kinds[0] == "response.created"
        assert kinds[-1] in ("response.completed", "response.incomplete")
        assert client.models.retrieve(ALIAS).id == ALIAS
        stats = http._transport.client.stats()  # type: ignore[attr-defined]
        assert stats.logical_calls == 4 and stats.attempts == 4
    finally:
        client.close()
