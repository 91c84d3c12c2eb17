"""``embeddings.create`` and ``models.retrieve`` on Client and AsyncClient (respx, both
modes): openai-python's requests and results, and the whole pipeline behind them."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import httpx
import pytest
import respx

import stormguard
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import Api


def vector_b64(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def embeddings_json(*vectors: object, model: str = "m") -> dict[str, Any]:
    return {
        "object": "list",
        "model": model,
        "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


def sent(route: respx.Route, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[index].request.content)
    return body


# -- models.retrieve ---------------------------------------------------------------------


async def test_models_retrieve_quotes_the_id_and_returns_a_model(
    api: Api, mock: respx.MockRouter
) -> None:
    model = {"id": "org/tiny model", "object": "model", "created": 1, "owned_by": "me"}
    route = mock.get(url__regex=r".*/models/.*").respond(
        200, json=model, headers={"x-queue-depth": "4", "x-request-id": "req-7"}
    )
    client = api.client()
    result = await api.run(client.models.retrieve("org/tiny model", extra_query={"a": "1"}))
    assert isinstance(result, stormguard.Model)
    assert (result.id, result.owned_by) == ("org/tiny model", "me")
    assert result.server_load.queue_depth == 4
    assert result.request_id == "req-7"
    assert [a.outcome for a in result.attempt_history] == ["ok"]
    # As openai-python sends it: the slash is part of the id, not of the path.
    assert route.calls[0].request.url.raw_path == b"/v1/models/org%2Ftiny%20model?a=1"


async def test_models_retrieve_refuses_an_empty_id_before_any_io(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.get(url__regex=r".*/models.*").respond(200, json={})
    with pytest.raises(ValueError, match="non-empty value for `model`"):
        await api.run(api.client().models.retrieve(""))
    assert route.call_count == 0


async def test_models_retrieve_404_is_not_found_and_not_retried(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.get("/models/nope").respond(
        404, json={"error": {"message": "The model `nope` does not exist", "code": "not_found"}}
    )
    with pytest.raises(stormguard.NotFoundError) as caught:
        await api.run(api.client().models.retrieve("nope"))
    assert caught.value.code == "not_found"
    assert route.call_count == 1


# -- embeddings.create ------------------------------------------------------------------


async def test_embeddings_ask_for_base64_and_return_floats(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/embeddings").respond(
        200, json=embeddings_json(vector_b64(0.5, -1.0, 2.0), vector_b64(0.25))
    )
    client = api.client()
    result = await api.run(
        client.embeddings.create(input=["a", "b"], dimensions=3, user="u", timeout=5)
    )
    assert sent(route) == {
        "model": "m",
        "input": ["a", "b"],
        "dimensions": 3,
        "user": "u",
        "encoding_format": "base64",
    }
    assert isinstance(result, stormguard.CreateEmbeddingResponse)
    assert [d.embedding for d in result.data] == [[0.5, -1.0, 2.0], [0.25]]
    assert [d.index for d in result.data] == [0, 1]
    assert result.usage.prompt_tokens == 3
    assert result.attempts == 1
    assert repr(result).startswith("CreateEmbeddingResponse(")


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_an_explicit_encoding_format_is_sent_and_left_as_it_comes(
    api: Api, mock: respx.MockRouter, encoding_format: str
) -> None:
    vector: object = [0.5, 1.5] if encoding_format == "float" else vector_b64(0.5, 1.5)
    route = mock.post("/embeddings").respond(200, json=embeddings_json(vector))
    result = await api.run(
        api.client().embeddings.create(input="a", encoding_format=encoding_format)
    )
    assert sent(route)["encoding_format"] == encoding_format
    assert result.data[0].embedding == vector


async def test_embeddings_input_iterables_and_not_given_values_are_sent_as_json(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/embeddings").respond(200, json=embeddings_json([1.0]))
    await api.run(
        api.client().embeddings.create(
            input=(iter([1, 2, 3]), (4, 5)),
            model="emb",
            encoding_format="float",
            dimensions=stormguard.NOT_GIVEN,
            extra_body={"truncate_prompt_tokens": 8},
        )
    )
    assert sent(route) == {
        "model": "emb",
        "input": [[1, 2, 3], [4, 5]],
        "encoding_format": "float",
        "truncate_prompt_tokens": 8,
    }


async def test_a_vector_that_is_not_base64_float32_is_a_validation_error(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/embeddings").respond(200, json=embeddings_json("AAAA!"))
    with pytest.raises(stormguard.APIResponseValidationError, match="Embedding 0 is not base64"):
        await api.run(api.client().embeddings.create(input="a"))
    mock.post("/embeddings").respond(200, json=embeddings_json("AAA="))  # 2 bytes
    with pytest.raises(stormguard.APIResponseValidationError, match="float32"):
        await api.run(api.client().embeddings.create(input="a"))
    assert route.call_count == 2  # one attempt each: an answer that is wrong is not retried


async def test_embeddings_are_retried_on_a_shed_with_the_same_body(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/embeddings").mock(
        side_effect=[
            httpx.Response(503, json={"error": {"message": "busy"}}, headers={"retry-after": "0"}),
            httpx.Response(200, json=embeddings_json([1.0])),
        ]
    )
    client = api.client(concurrency=None)
    result = await api.run(client.embeddings.create(input="a", encoding_format="float"))
    assert result.attempts == 2
    assert sent(route, 0) == sent(route, 1)
    assert route.calls[1].request.headers["x-stormguard-attempt"] == "2"
    assert client.stats().attempts == 2


async def test_embeddings_inputs_are_prechecked_one_by_one_against_the_window(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/embeddings").respond(200, json=embeddings_json([1.0]))
    policy = TokenPolicy(
        context_windows={"m": 8}, server_context_windows=False, server_tokenize=False
    )
    client = api.client(token_policy=policy)
    result = await api.run(
        client.embeddings.create(input=["short", "tiny"], encoding_format="float")
    )
    assert result.precheck is not None
    assert result.precheck.max_tokens == 0 and 0 < result.precheck.prompt_tokens <= 8
    with pytest.raises(stormguard.ContextWindowExceededError):
        await api.run(client.embeddings.create(input=["short", "word " * 40]))
    assert route.call_count == 1
