"""LangChain (langchain-openai's ``ChatOpenAI``) over stormguard, both ways:
``http_client=``/``http_async_client=`` stormguard's, or ``client=``/``root_client=``
(and their async twins) a ``stormguard.OpenAI``."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

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


def chat_model(base_url: str, way: str) -> ChatOpenAI:
    """``ChatOpenAI`` over stormguard, at LangChain's and openai's default retries."""
    if way == "http_client":
        return ChatOpenAI(
            model=MODEL,
            base_url=base_url,
            api_key=KEY,
            http_client=tracked(stormguard.httpx_client(base_url=base_url)),
            http_async_client=tracked(stormguard.async_httpx_client(base_url=base_url)),
        )
    sync = tracked(stormguard.OpenAI(base_url=base_url, api_key=KEY))
    async_ = tracked(stormguard.AsyncOpenAI(base_url=base_url, api_key=KEY))
    return ChatOpenAI(
        model=MODEL,
        api_key=KEY,
        client=sync.chat.completions,
        root_client=sync,
        async_client=async_.chat.completions,
        root_async_client=async_,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with reference_server() as running:
        yield running


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


def test_a_plain_call(server: RunningServer, way: str) -> None:
    reply = chat_model(server.base_url, way).invoke("hi", max_tokens=8)
    assert isinstance(reply.content, str) and reply.content.strip()
    assert reply.response_metadata["model_name"] == MODEL


def test_a_stream(server: RunningServer, way: str) -> None:
    chunks = list(chat_model(server.base_url, way).stream("hi", max_tokens=8))
    assert len(chunks) > 2
    assert "".join(str(chunk.content) for chunk in chunks).strip()


async def test_an_async_call_and_stream(server: RunningServer, way: str) -> None:
    llm = chat_model(server.base_url, way)
    reply = await llm.ainvoke("hi", max_tokens=8)
    assert isinstance(reply.content, str) and reply.content.strip()
    pieces = [str(chunk.content) async for chunk in llm.astream("hi", max_tokens=8)]
    assert "".join(pieces).strip()


def test_a_tool_call(server: RunningServer, way: str) -> None:
    reply = chat_model(server.base_url, way).bind_tools([tool(add)]).invoke("add 2 and 3")
    (call,) = reply.tool_calls
    assert call["name"] == "add"
    assert isinstance(call["args"]["a"], int) and isinstance(call["args"]["b"], int)


def test_structured_output(server: RunningServer, way: str) -> None:
    person = chat_model(server.base_url, way).with_structured_output(Person).invoke("a person")
    assert isinstance(person, Person)


def test_a_500(way: str) -> None:
    with failing("500") as target, pytest.raises(openai.InternalServerError) as raised:
        chat_model(target.base_url, way).invoke("hi")
    assert raised.value.status_code == 500
    if way == "stormguard_client":  # LangChain's error is raised from stormguard's
        assert isinstance(raised.value.__cause__, stormguard.InternalServerError)
    assert target.requests == alone("500")


def test_a_shed_with_retry_after(way: str) -> None:
    with failing("shed") as target, pytest.raises(openai.InternalServerError) as raised:
        chat_model(target.base_url, way).invoke("hi")
    assert raised.value.status_code == 503
    assert target.requests == alone("shed")


def test_a_refused_connection(way: str) -> None:
    with failing("refused") as target, pytest.raises(openai.APIConnectionError):
        chat_model(target.base_url, way).invoke("hi")
    assert target.requests == alone("refused")  # the connections tried


def test_a_crash_after_the_first_chunk(way: str) -> None:
    received: list[str] = []
    with failing("crash") as target, pytest.raises(openai.APIConnectionError) as raised:
        for chunk in chat_model(target.base_url, way).stream("hi"):
            received.append(str(chunk.content))
    assert FIRST_CHUNK in received  # what came before the crash; then an error, not an end
    assert isinstance(raised.value.__cause__, stormguard.StreamInterruptedError)
    assert target.requests == alone("crash") == 1
