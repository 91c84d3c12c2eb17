"""embeddings, responses (streamed and not) and models.retrieve under the real openai
package over stormguard's transport (sync and async): the same protection as chat,
streams handed on as they arrive, and spans that know each API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import respx

from tests.sdk.client.test_endpoints_embeddings_models import embeddings_json, vector_b64
from tests.sdk.client.test_endpoints_responses import events, response_json, stream_of
from tests.sdk.helpers import BASE
from tests.sdk.telemetry.test_telemetry import Otel, otel  # noqa: F401  (the fixture)
from tests.sdk.transport.test_transport import Oai, mock, mode  # noqa: F401  (fixtures)


async def call(oai: Oai, value: Any) -> Any:
    return await value if oai.mode == "async" else value


class Paced:
    """A response body handed out piece by piece, recording how far it was read."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.produced = 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.pieces:
            self.produced += 1
            yield piece

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self:
            yield piece

    def response(self, sync: bool) -> httpx.Response:
        content: Any = self if sync else self.__aiter__()
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)


async def test_responses_stream_is_retried_then_passed_through_as_it_arrives(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,  # noqa: F811
    otel: Otel,  # noqa: F811
) -> None:
    items = stream_of("he", "llo")
    paced = Paced([events(item) for item in items])
    route = mock.post(f"{BASE}/responses").mock(
        side_effect=[httpx.Response(502, json={}), paced.response(mode == "sync")]
    )
    oai = Oai(mode, telemetry=otel.telemetry)
    stream = await call(oai, oai.client.responses.create(model="m", input="hi", stream=True))
    iterator = stream if mode == "sync" else stream.__aiter__()
    first = next(iterator) if mode == "sync" else await iterator.__anext__()
    assert first.type == "response.created"
    assert paced.produced < len(items)  # not read whole before the caller had its first event
    rest = await oai.collect(iterator)
    assert isinstance(rest[-1], openai.types.responses.ResponseCompletedEvent)
    assert rest[-1].response.output_text == "hello!"
    assert route.call_count == 2 and oai.stats.attempts == 2
    span = otel.logical()
    assert span.name == "chat m" and span.status.is_ok
    attributes = span.attributes or {}
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.response.finish_reasons"] == ("completed",)
    assert attributes["gen_ai.usage.output_tokens"] == 2


async def test_a_failed_response_stream_ends_the_call_as_failed(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,  # noqa: F811
    otel: Otel,  # noqa: F811
) -> None:
    body = events(
        *stream_of("a")[:3],
        {"type": "error", "code": "engine_unavailable", "message": "engine failed", "param": None},
        {"type": "response.failed", "response": response_json(status="failed")},
    )
    mock.post(f"{BASE}/responses").mock(
        return_value=httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=body
        )
    )
    oai = Oai(mode, telemetry=otel.telemetry)
    stream = await call(oai, oai.client.responses.create(model="m", input="hi", stream=True))
    got = await oai.collect(stream)  # openai hands on both failure events as events
    assert [e.type for e in got][-2:] == ["error", "response.failed"]
    span = otel.logical()
    assert not span.status.is_ok
    assert (span.attributes or {})["error.type"] == "InternalServerError"


async def test_responses_json_and_models_retrieve_under_openai(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,  # noqa: F811
) -> None:
    mock.post(f"{BASE}/responses").mock(
        side_effect=[
            httpx.Response(503, json={"error": {"message": "busy"}}, headers={"retry-after": "0"}),
            httpx.Response(200, json=response_json("hey")),
        ]
    )
    model = {"id": "org/m", "object": "model", "created": 1, "owned_by": "me"}
    retrieve = mock.get(url__regex=r".*/models/.*").respond(200, json=model)
    oai = Oai(mode, concurrency=None)
    response = await call(oai, oai.client.responses.create(model="m", input="hi"))
    assert response.output_text == "hey!"
    assert oai.stats.attempts == 2
    found = await call(oai, oai.client.models.retrieve("org/m"))
    assert found.id == "org/m"
    assert retrieve.calls[0].request.url.raw_path == b"/v1/models/org%2Fm"


async def test_embeddings_under_openai_are_protected_and_decoded_by_openai(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,  # noqa: F811
    otel: Otel,  # noqa: F811
) -> None:
    route = mock.post(f"{BASE}/embeddings").mock(
        side_effect=[
            httpx.Response(502, json={}),
            httpx.Response(200, json=embeddings_json(vector_b64(0.5, 2.0))),
        ]
    )
    oai = Oai(mode, telemetry=otel.telemetry)
    result = await call(oai, oai.client.embeddings.create(model="e", input=["a"]))
    assert result.data[0].embedding == [0.5, 2.0]
    assert json.loads(route.calls[1].request.content)["encoding_format"] == "base64"
    assert route.call_count == 2
    attributes = otel.logical().attributes or {}
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert otel.logical().name == "embeddings e"


@pytest.mark.parametrize("path", ["responses", "embeddings"])
async def test_the_new_paths_are_prechecked_under_openai(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,  # noqa: F811
    path: str,
) -> None:
    from stormguard.tokens import TokenPolicy

    route = mock.post(f"{BASE}/{path}").respond(200, json={})
    policy = TokenPolicy(
        context_windows={"m": 8}, server_context_windows=False, server_tokenize=False
    )
    oai = Oai(mode, token_policy=policy)
    with pytest.raises(openai.BadRequestError, match="context window"):
        if path == "responses":
            await call(oai, oai.client.responses.create(model="m", input="word " * 40))
        else:
            await call(oai, oai.client.embeddings.create(model="m", input=["word " * 40]))
    assert route.call_count == 0
