"""/v1/responses and /v1/embeddings through the admission middleware, against real vLLM.

vLLM serves a model either for generation (chat, completions, Responses) or, with
``--runner pooling --convert embed``, for embeddings; never both. The middleware
admits all four routes on either: the route vLLM does not serve still passes
admission (a too-long request is our 400, a flood is shed) and otherwise gets
vLLM's own 404 with the load headers.

The cost the middleware counts (``request_cost``, with the model's own tokenizer)
is checked against the tokens vLLM reports using.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

import stormguard
from stormguard import RetryPolicy
from stormguard.protocol import LOAD_HEADERS, ServerLoad
from stormguard_server.vllm.costs import request_cost
from tests.vllm.vllm_process import VllmServer, run_vllm

ONE_TRY = RetryPolicy(max_attempts=1)
MAX_MODEL_LEN = 4096  # tests/vllm/vllm_process.py TINY_ARGS


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def embedding_vllm(tiny_model: str) -> Iterator[VllmServer]:
    """The tiny model served for embeddings (a pooling model) behind admission."""
    with run_vllm(
        tiny_model,
        "--runner",
        "pooling",
        "--convert",
        "embed",
    ) as server:
        yield server


def counted(path: str, body: dict[str, Any], tokenizer: Any) -> int:
    cost = request_cost(path, body, tokenizer, MAX_MODEL_LEN)
    assert cost is not None and cost.too_long is None
    return cost.prompt_tokens


def assert_load_headers(headers: httpx.Headers) -> None:
    for name in LOAD_HEADERS:
        assert name in headers, name
    assert int(headers["x-token-capacity"]) > 0


def assert_load_read(load: ServerLoad) -> None:
    """The SDK read our load headers off the answer."""
    assert load.token_capacity is not None and load.token_capacity > 0
    assert load.queue_depth is not None and load.kv_cache_usage is not None


# -- a generation model: Responses served, embeddings not ---------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"input": "tell me about the token cache"},
        {"input": "tell me about the token cache", "instructions": "answer briefly"},
        {
            "input": [
                {"role": "user", "content": "what is a KV block?"},
                {"role": "assistant", "content": "a page"},
                {"role": "user", "content": [{"type": "input_text", "text": "and a queue?"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "and"},
                        {"type": "input_text", "text": " a deadline?"},
                    ],
                },
            ],
            "instructions": "answer briefly",
        },
    ],
)
def test_responses_cost_the_tokens_vllm_counts(
    guarded_vllm: VllmServer, tokenizer: Any, body: dict[str, Any]
) -> None:
    with stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model) as client:
        response = client.responses.create(**body, max_output_tokens=6)
    assert response.usage is not None
    assert response.usage.input_tokens == counted("/v1/responses", body, tokenizer)
    assert response.usage.output_tokens <= 6
    assert_load_read(response.server_load)


def test_a_responses_stream_carries_the_load_headers(guarded_vllm: VllmServer) -> None:
    with stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model) as client:
        stream = client.responses.create(
            input="tell me about the token cache",
            max_output_tokens=8,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        kinds = [event.type for event in stream]
        assert_load_headers(stream.response.headers)
    assert kinds[0] == "response.created"
    assert kinds.count("response.output_text.delta") >= 1
    assert kinds[-1] in {"response.completed", "response.incomplete"}


def test_a_too_long_responses_request_is_refused_before_vllm(guarded_vllm: VllmServer) -> None:
    client = stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model)
    with client, pytest.raises(stormguard.BadRequestError) as info:
        client.responses.create(input="tell me about the token cache", max_output_tokens=4090)
    err = info.value
    assert err.code == "context_length_exceeded" and err.param == "input"
    assert err.server_load.load_shed == "too_long"
    assert err.server_load.should_retry is False
    assert err.attempts == 1


async def test_behind_a_long_stream_responses_and_embeddings_queue_or_are_shed(
    guarded_vllm: VllmServer, tokenizer: Any
) -> None:
    """A Responses stream of 3,000 tokens holds most of the budget (3,072 of 3,916
    tokens in blocks of 128) for seconds. Five Responses requests and five embeddings
    requests of 2,000 tokens each arrive meanwhile: none fits, six wait in the queue
    (--max-queue-requests 6), four are shed at once with our headers. Once the stream
    is closed the six run: the Responses requests are answered, the embeddings get
    vLLM's 404 (a generation model serves none)."""
    text = "the token cache " * 500
    tokens = len(tokenizer.encode(text))
    assert 1500 < tokens < 2500, tokens
    async with stormguard.AsyncClient(
        base_url=guarded_vllm.base_url,
        model=guarded_vllm.model,
        retry_policy=ONE_TRY,
        breaker=None,
        concurrency=None,  # no local pacing: every request reaches the server at once
        timeout=60,
    ) as client:
        holder = await client.responses.create(
            input="tell me about the token cache",
            max_output_tokens=3000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        first = await holder.__anext__()
        assert first.type == "response.created"

        async def respond() -> object:
            return await client.responses.create(input=text, max_output_tokens=16)

        async def embed() -> object:
            return await client.embeddings.create(input=text)

        calls = [asyncio.ensure_future(c()) for c in (respond, embed) for _ in range(5)]
        pending = set(calls)
        while len(pending) > len(calls) - 4:  # the four shed come back at once
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await holder.aclose()
        results = await asyncio.gather(*calls, return_exceptions=True)
    shed = [r for r in results if isinstance(r, stormguard.ServiceUnavailableError)]
    answered = [r for r in results if isinstance(r, stormguard.Response)]
    not_served = [r for r in results if isinstance(r, stormguard.NotFoundError)]
    assert len(shed) == 4, results
    assert len(answered) + len(not_served) == 6, results
    for err in shed:
        assert err.server_load.load_shed == "queue_full"
        assert err.server_load.retry_after is not None and err.server_load.retry_after > 0
        assert err.server_load.queue_depth == 6
        assert err.server_load.inflight_tokens is not None
        assert err.server_load.inflight_tokens >= 3000


def test_embeddings_on_a_generation_model_pass_admission_then_get_vllms_404(
    guarded_vllm: VllmServer,
) -> None:
    client = stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model)
    with client:
        with pytest.raises(stormguard.NotFoundError) as missing:
            client.embeddings.create(input=["storm", "guard"])
        # Admission still applies: an input over the context is our 400.
        with pytest.raises(stormguard.BadRequestError) as too_long:
            client.embeddings.create(input="word " * 5000)
    assert missing.value.attempts == 1
    assert_load_read(missing.value.server_load)
    assert too_long.value.code == "context_length_exceeded"
    assert too_long.value.server_load.load_shed == "too_long"


# -- an embedding model (--runner pooling): embeddings served, Responses not ---------


def test_embeddings_cost_the_tokens_vllm_counts(embedding_vllm: VllmServer, tokenizer: Any) -> None:
    inputs = ["storm", "the guard of the token cache", "x " * 300]
    with stormguard.Client(base_url=embedding_vllm.base_url, model=embedding_vllm.model) as client:
        result = client.embeddings.create(input=inputs)
        ids = client.embeddings.create(input=[[5, 6, 7], [8]])
    assert [item.index for item in result.data] == [0, 1, 2]
    assert len({len(item.embedding) for item in result.data}) == 1
    assert result.usage.prompt_tokens == counted("/v1/embeddings", {"input": inputs}, tokenizer)
    assert ids.usage.prompt_tokens == 4
    assert_load_read(result.server_load)


def test_a_too_long_embeddings_input_is_refused_before_vllm(embedding_vllm: VllmServer) -> None:
    client = stormguard.Client(base_url=embedding_vllm.base_url, model=embedding_vllm.model)
    with client, pytest.raises(stormguard.BadRequestError) as info:
        client.embeddings.create(input=["short", "word " * 5000])
    err = info.value
    assert err.code == "context_length_exceeded" and "in input 1" in err.message
    assert err.server_load.load_shed == "too_long"
    assert err.attempts == 1


def test_responses_on_an_embedding_model_pass_admission_then_get_vllms_404(
    embedding_vllm: VllmServer,
) -> None:
    client = stormguard.Client(base_url=embedding_vllm.base_url, model=embedding_vllm.model)
    with client:
        with pytest.raises(stormguard.NotFoundError) as missing:
            client.responses.create(input="hi", max_output_tokens=4)
        with pytest.raises(stormguard.BadRequestError) as too_long:
            client.responses.create(input="hi", max_output_tokens=5000)
    assert missing.value.attempts == 1
    assert_load_read(missing.value.server_load)
    assert too_long.value.server_load.load_shed == "too_long"
