"""pydantic-ai (``OpenAIChatModel`` over an ``OpenAIProvider``) over stormguard, both
ways: ``OpenAIProvider(http_client=stormguard.async_httpx_client(...))``, or
``OpenAIProvider(openai_client=stormguard.AsyncOpenAI(...))``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.exceptions import ModelAPIError, ModelConnectionError, ModelHTTPError
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

import stormguard
from tests.e2e.server_process import RunningServer
from tests.frameworks.scenarios import (
    FIRST_CHUNK,
    KEY,
    MODEL,
    WAYS,
    Person,
    add,
    alone,
    failing,
    reference_server,
    tracked,
)

SHORT = ModelSettings(max_tokens=8)


def chat_model(base_url: str, way: str) -> OpenAIChatModel:
    """pydantic-ai's OpenAI model over stormguard, at its and openai's default retries."""
    if way == "http_client":
        provider = OpenAIProvider(
            base_url=base_url,
            api_key=KEY,
            http_client=tracked(stormguard.async_httpx_client(base_url=base_url)),
        )
    else:
        client = tracked(stormguard.AsyncOpenAI(base_url=base_url, api_key=KEY))
        provider = OpenAIProvider(openai_client=client)
    return OpenAIChatModel(MODEL, provider=provider)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with reference_server() as running:
        yield running


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


def test_a_plain_call(server: RunningServer, way: str) -> None:
    result = Agent(chat_model(server.base_url, way)).run_sync("hi", model_settings=SHORT)
    assert result.output.strip()
    assert result.usage.output_tokens > 0


async def test_an_async_stream(server: RunningServer, way: str) -> None:
    agent = Agent(chat_model(server.base_url, way))
    async with agent.run_stream("hi", model_settings=SHORT) as run:
        pieces = [piece async for piece in run.stream_text(delta=True)]
    assert pieces and "".join(pieces).strip()


async def test_an_async_call(server: RunningServer, way: str) -> None:
    result = await Agent(chat_model(server.base_url, way)).run("hi", model_settings=SHORT)
    assert result.output.strip()


def test_a_tool_call(server: RunningServer, way: str) -> None:
    agent = Agent(chat_model(server.base_url, way))
    calls: list[tuple[int, int]] = []

    @agent.tool_plain
    def add_numbers(a: int, b: int) -> int:
        """Add two whole numbers."""
        calls.append((a, b))
        return add(a, b)

    result = agent.run_sync("add 2 and 3")
    assert len(calls) == 1 and all(isinstance(n, int) for n in calls[0])
    assert result.output.strip()  # the answer after the tool's result


#: pydantic-ai's two ways to ask for a Person: an output tool the model calls (its
#: default), or the API's own structured output (``response_format`` with the schema).
OUTPUTS: dict[str, Any] = {"tool": Person, "native": NativeOutput(Person)}


@pytest.mark.parametrize("output", OUTPUTS.values(), ids=OUTPUTS.keys())
def test_structured_output(server: RunningServer, way: str, output: Any) -> None:
    result = Agent(chat_model(server.base_url, way), output_type=output).run_sync("a person")
    assert isinstance(result.output, Person)


def test_max_retries_in_model_settings(server: RunningServer, way: str) -> None:
    """pydantic-ai copies the client for it, over the same HTTP client (``with_options``)."""
    settings = ModelSettings(max_tokens=8, max_retries=1)
    result = Agent(chat_model(server.base_url, way)).run_sync("hi", model_settings=settings)
    assert result.output.strip()


def test_a_500(way: str) -> None:
    with failing("500") as target, pytest.raises(ModelHTTPError) as raised:
        Agent(chat_model(target.base_url, way)).run_sync("hi")
    assert raised.value.status_code == 500
    assert isinstance(raised.value.__cause__, openai.InternalServerError)
    assert target.requests == alone("500")


def test_a_shed_with_retry_after(way: str) -> None:
    with failing("shed") as target, pytest.raises(ModelHTTPError) as raised:
        Agent(chat_model(target.base_url, way)).run_sync("hi")
    assert raised.value.status_code == 503
    if way == "stormguard_client":
        assert isinstance(raised.value.__cause__, stormguard.ServiceUnavailableError)
    assert target.requests == alone("shed")


def test_a_refused_connection(way: str) -> None:
    with failing("refused") as target, pytest.raises(ModelConnectionError) as raised:
        Agent(chat_model(target.base_url, way)).run_sync("hi")
    assert isinstance(raised.value.__cause__, openai.APIConnectionError)
    assert target.requests == alone("refused")  # the connections tried


async def test_a_crash_after_the_first_chunk(way: str) -> None:
    received: list[str] = []
    with failing("crash") as target, pytest.raises(ModelAPIError) as raised:
        async with Agent(chat_model(target.base_url, way)).run_stream("hi") as run:
            async for piece in run.stream_text(delta=True, debounce_by=None):
                received.append(piece)
    assert received == [FIRST_CHUNK]  # what came before the crash; then an error, not an end
    assert isinstance(raised.value.__cause__, stormguard.StreamInterruptedError)
    assert target.requests == alone("crash") == 1
