"""Type-checked, never run: openai-python-style ``.with_raw_response`` and
``.with_streaming_response`` calls (test_raw_responses.py runs mypy --strict on it)."""

from __future__ import annotations

import stormguard

MESSAGES = [{"role": "user", "content": "hi"}]


def sync_calls(client: stormguard.Client) -> None:
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    header: str | None = raw.headers.get("x-request-id")
    status: int = raw.status_code
    completion: stormguard.ChatCompletion = raw.parse()
    retries: int = raw.retries_taken
    history: tuple[stormguard.AttemptRecord, ...] = raw.attempt_history
    embeddings: stormguard.CreateEmbeddingResponse = client.embeddings.with_raw_response.create(
        input="a"
    ).parse()
    model: stormguard.Model = client.models.with_raw_response.retrieve("m").parse()
    models: stormguard.ModelList = client.models.with_raw_response.list().parse()
    response: stormguard.Response = client.responses.with_raw_response.create(input="a").parse()
    text: stormguard.Completion = client.completions.with_raw_response.create(prompt="a").parse()
    streamed = client.chat.completions.with_raw_response.create(messages=MESSAGES, stream=True)
    with streamed.parse() as stream:
        chunks: list[stormguard.ChatCompletionChunk] = list(stream)
    print(header, status, completion.choices, retries, history, embeddings, model, models)
    print(chunks)
    print(response.output_text, text.choices)


async def async_calls(client: stormguard.AsyncClient) -> None:
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    completion: stormguard.ChatCompletion = raw.parse()
    model: stormguard.Model = (await client.models.with_raw_response.retrieve("m")).parse()
    events = await client.responses.with_raw_response.create(input="a", stream=True)
    async for event in events.parse():
        print(event.type)
    print(completion.id, raw.request_id, model.id)


def sync_streaming(client: stormguard.Client) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES
    ) as response:
        status: int = response.status_code
        lines: list[str] = list(response.iter_lines())
        completion: stormguard.ChatCompletion = response.parse()
    with client.models.with_streaming_response.retrieve("m") as response_of_model:
        model: stormguard.Model = response_of_model.parse()
        data: bytes = response_of_model.read()
    print(status, lines, completion.id, model.id, data)


async def async_streaming(client: stormguard.AsyncClient) -> None:
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES
    ) as response:
        async for line in response.iter_lines():
            print(line)
        completion: stormguard.ChatCompletion = await response.parse()
    async with client.embeddings.with_streaming_response.create(input="a") as response_of_e:
        vectors: stormguard.CreateEmbeddingResponse = await response_of_e.parse()
    print(completion.id, vectors.data)


def through_the_client(client: stormguard.Client) -> None:
    completion: stormguard.ChatCompletion = client.with_raw_response.chat.completions.create(
        messages=MESSAGES
    ).parse()
    with client.chat.with_streaming_response.completions.create(messages=MESSAGES) as response:
        again: stormguard.ChatCompletion = response.parse()
    print(completion.id, again.id)


async def through_the_async_client(client: stormguard.AsyncClient) -> None:
    raw = await client.with_raw_response.models.retrieve("m")
    model: stormguard.Model = raw.parse()
    async with client.with_streaming_response.embeddings.create(input="a") as response:
        vectors: stormguard.CreateEmbeddingResponse = await response.parse()
    print(model.id, vectors.data)
