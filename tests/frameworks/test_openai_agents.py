"""The OpenAI Agents SDK (``OpenAIChatCompletionsModel`` and ``OpenAIResponsesModel``)
over stormguard, both ways: ``openai_client=openai.AsyncOpenAI(http_client=
stormguard.async_httpx_client(...))``, or ``openai_client=stormguard.AsyncOpenAI(...)``.
Tracing is off (tests/frameworks/conftest.py): it would send each run to OpenAI."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

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

set_tracing_disabled(True)

APIS = {"chat": OpenAIChatCompletionsModel, "responses": OpenAIResponsesModel}


def client(base_url: str, way: str) -> openai.AsyncOpenAI:
    """The client the SDK is given, at openai's default retries."""
    if way == "http_client":
        http = tracked(stormguard.async_httpx_client(base_url=base_url))
        return openai.AsyncOpenAI(base_url=base_url, api_key=KEY, http_client=http)
    return tracked(stormguard.AsyncOpenAI(base_url=base_url, api_key=KEY))


def agent(base_url: str, way: str, api: str = "chat", **options: Any) -> Agent[Any]:
    model = APIS[api](model=MODEL, openai_client=client(base_url, way))
    return Agent(name="assistant", model=model, **options)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with reference_server() as running:
        yield running


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture(params=list(APIS))
def api(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


async def test_an_async_call(server: RunningServer, way: str, api: str) -> None:
    result = await Runner.run(agent(server.base_url, way, api), "hi")
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_a_plain_call(server: RunningServer, way: str) -> None:
    settings = ModelSettings(max_tokens=8)
    result = Runner.run_sync(agent(server.base_url, way, model_settings=settings), "hi")
    assert result.final_output.strip()


async def test_a_stream(server: RunningServer, way: str, api: str) -> None:
    run = Runner.run_streamed(agent(server.base_url, way, api), "hi")
    kinds = [event.type async for event in run.stream_events()]
    assert kinds.count("raw_response_event") > 2
    assert isinstance(run.final_output, str) and run.final_output.strip()


async def test_a_tool_call(server: RunningServer, way: str, api: str) -> None:
    calls: list[tuple[int, int]] = []

    @function_tool
    def add_numbers(a: int, b: int) -> int:
        """Add two whole numbers."""
        calls.append((a, b))
        return add(a, b)

    result = await Runner.run(agent(server.base_url, way, api, tools=[add_numbers]), "add 2, 3")
    assert len(calls) == 1 and all(isinstance(n, int) for n in calls[0])
    assert result.final_output.strip()


async def test_structured_output(server: RunningServer, way: str, api: str) -> None:
    result = await Runner.run(agent(server.base_url, way, api, output_type=Person), "a person")
    assert isinstance(result.final_output, Person)


async def test_a_500(way: str, api: str) -> None:
    with failing("500") as target, pytest.raises(openai.InternalServerError) as raised:
        await Runner.run(agent(target.base_url, way, api), "hi")
    assert raised.value.status_code == 500
    if way == "stormguard_client":  # import stormguard as openai: except openai.X catches it
        assert isinstance(raised.value, stormguard.InternalServerError)
    assert target.requests == alone("500")


async def test_a_shed_with_retry_after(way: str) -> None:
    with failing("shed") as target, pytest.raises(openai.InternalServerError) as raised:
        await Runner.run(agent(target.base_url, way), "hi")
    assert raised.value.status_code == 503
    assert target.requests == alone("shed")


async def test_a_refused_connection(way: str) -> None:
    with failing("refused") as target, pytest.raises(openai.APIConnectionError) as raised:
        await Runner.run(agent(target.base_url, way), "hi")
    assert isinstance(raised.value, stormguard.APIConnectionError)  # the call's own error
    assert target.requests == alone("refused")  # the connections tried


async def test_a_crash_after_the_first_chunk(way: str) -> None:
    deltas: list[str] = []
    with failing("crash") as target, pytest.raises(openai.APIConnectionError) as raised:
        run = Runner.run_streamed(agent(target.base_url, way), "hi")
        async for event in run.stream_events():
            if event.type == "raw_response_event" and hasattr(event.data, "delta"):
                deltas.append(str(event.data.delta))
    assert deltas == [FIRST_CHUNK]  # what came before the crash; then an error, not an end
    assert isinstance(raised.value, stormguard.StreamInterruptedError)
    assert target.requests == alone("crash") == 1
