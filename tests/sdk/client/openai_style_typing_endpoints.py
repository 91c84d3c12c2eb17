"""Type-checked, never run: openai-python-style calls of the endpoints beyond chat, as
users write them (test_endpoints_responses.py runs mypy --strict on this file)."""

from __future__ import annotations

import httpx
import openai

import stormguard


def sync_calls(client: stormguard.Client) -> None:
    vectors: stormguard.CreateEmbeddingResponse = client.embeddings.create(
        input=["a", "b"], model="e", dimensions=openai.NOT_GIVEN, timeout=httpx.Timeout(5)
    )
    first: list[float] = vectors.data[0].embedding
    client.embeddings.create(input=[[1, 2]], encoding_format="float", user="u")
    response: stormguard.Response = client.responses.create(
        model="m", input="hi", instructions="short", max_output_tokens=16, temperature=0.2
    )
    text: str = response.output_text
    with client.responses.create(
        model="m", input=[{"role": "user", "content": "hi"}], stream=True
    ) as stream:
        for event in stream:
            kind: str = event.type
    model: stormguard.Model = client.models.retrieve("org/model", extra_query={"a": 1})
    print(first, text, kind, model.id)


async def async_calls(client: stormguard.AsyncClient) -> None:
    await client.embeddings.create(input="a", model="e")
    response = await client.responses.create(model="m", input="hi")
    print(response.output_text)
    stream = await client.responses.create(model="m", input="hi", stream=True)
    async for event in stream:
        print(event.type, event.delta)
    print((await client.models.retrieve("m")).owned_by)
