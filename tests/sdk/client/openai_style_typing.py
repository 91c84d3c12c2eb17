"""openai-python-style calls that mypy --strict must accept on stormguard's clients
(type-checked by test_openai_conventions.py, never run)."""

from __future__ import annotations

import httpx
import openai

import stormguard


def sync_calls(client: stormguard.Client) -> None:
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        timeout=httpx.Timeout(10, connect=2),
        extra_query={"api-version": "2024-06-01"},
        extra_headers={"x-trace": "t"},
        extra_body={"seed": 1},
        temperature=openai.NOT_GIVEN,
    )
    client.chat.completions.create(model="m", messages=[], timeout=openai.Timeout(5))
    client.chat.completions.create(model="m", messages=[], timeout=stormguard.NOT_GIVEN)
    client.completions.create(model="m", prompt="p", timeout=3.5, extra_query={"a": 1})
    client.models.list(timeout=None, extra_query={"page": 2})
    other = client.with_options(timeout=httpx.Timeout(30), max_retries=5)
    other.copy(default_headers={"x": "y"}, default_query={"q": "1"}, organization="o")
    stormguard.Client(
        timeout=httpx.Timeout(600, connect=5.0),
        max_retries=2,
        organization="org",
        project="proj",
        default_headers={"x": "y"},
        default_query={"q": 1},
        connection_limits=httpx.Limits(max_connections=10),
    )


async def async_calls(client: stormguard.AsyncClient) -> None:
    await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        timeout=httpx.Timeout(10, connect=2),
        extra_query={"api-version": "2024-06-01"},
    )
    await client.with_options(max_retries=0).models.list(timeout=openai.Timeout(5))


def openai_sentinels(client: stormguard.Client) -> None:
    """openai's NOT_GIVEN and omit where stormguard's are typed (wrappers pass them)."""
    client.chat.completions.create(model="m", messages=[], timeout=openai.NOT_GIVEN)
    client.embeddings.create(input="a", model="e", encoding_format=openai.NOT_GIVEN)
    client.responses.create(
        model="m",
        input="hi",
        instructions=openai.NOT_GIVEN,
        max_output_tokens=openai.omit,
        stream=openai.NOT_GIVEN,
    )


def stream_bounds(client: stormguard.Client) -> None:
    """A stream's own bounds per call, typed on every streamed create."""
    bounds = stormguard.StreamTimeouts(first_chunk=10, idle=30)
    client.chat.completions.create(model="m", messages=[], stream=True, stream_timeouts=bounds)
    client.completions.create(model="m", prompt="p", stream=True, stream_timeouts=None)
    client.responses.create(model="m", input="hi", stream=True, stream_timeouts=bounds)
