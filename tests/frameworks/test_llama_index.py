"""LlamaIndex (``llama_index.llms.openai.OpenAI`` and ``OpenAILike``) over stormguard,
both ways: ``http_client=``/``async_http_client=`` stormguard's, or
``openai_client=``/``async_openai_client=`` a ``stormguard.OpenAI``.

LlamaIndex retries above openai's client: a decorator on each call retries an
``APIConnectionError``, ``APITimeoutError``, ``RateLimitError`` or
``InternalServerError`` ``max_retries`` times (3 by default), waiting 1 to 20 s, with
new calls that stormguard cannot tell from the caller's own. ``max_retries=0`` turns it
off (docs/frameworks.md): the failure tests set it and see what stormguard alone sends;
one test shows the decorator's stack at its default."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI
from llama_index.llms.openai_like import OpenAILike

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

HI = [ChatMessage(role="user", content="hi")]
KINDS = ("openai", "openai_like")


def llm(base_url: str, way: str, kind: str = "openai", **options: Any) -> OpenAI:
    """LlamaIndex's OpenAI LLM (or ``OpenAILike``) over stormguard."""
    if way == "http_client":
        options.update(
            api_base=base_url,
            api_key=KEY,
            http_client=tracked(stormguard.httpx_client(base_url=base_url)),
            async_http_client=tracked(stormguard.async_httpx_client(base_url=base_url)),
        )
    else:
        options.update(
            api_key=KEY,
            openai_client=tracked(stormguard.OpenAI(base_url=base_url, api_key=KEY)),
            async_openai_client=tracked(stormguard.AsyncOpenAI(base_url=base_url, api_key=KEY)),
        )
    if kind == "openai_like":
        return OpenAILike(
            model=MODEL,
            is_chat_model=True,
            is_function_calling_model=True,
            context_window=2048,
            **options,
        )
    return OpenAI(model=MODEL, **options)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with reference_server() as running:
        yield running


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


def test_a_plain_call(server: RunningServer, way: str, kind: str) -> None:
    reply = llm(server.base_url, way, kind).chat(HI, max_tokens=8)
    assert reply.message.content and reply.message.content.strip()


def test_a_stream(server: RunningServer, way: str, kind: str) -> None:
    deltas = [r.delta or "" for r in llm(server.base_url, way, kind).stream_chat(HI, max_tokens=8)]
    assert len(deltas) > 2 and "".join(deltas).strip()


async def test_an_async_call_and_stream(server: RunningServer, way: str, kind: str) -> None:
    model = llm(server.base_url, way, kind)
    reply = await model.achat(HI, max_tokens=8)
    assert reply.message.content and reply.message.content.strip()
    deltas = [r.delta or "" async for r in await model.astream_chat(HI, max_tokens=8)]
    assert "".join(deltas).strip()


def test_a_tool_call(server: RunningServer, way: str, kind: str) -> None:
    model = llm(server.base_url, way, kind)
    reply = model.chat_with_tools([FunctionTool.from_defaults(fn=add)], user_msg="add 2 and 3")
    (call,) = model.get_tool_calls_from_response(reply, error_on_no_tool_call=True)
    assert call.tool_name == "add"
    assert isinstance(call.tool_kwargs["a"], int) and isinstance(call.tool_kwargs["b"], int)


def test_structured_output(server: RunningServer, way: str, kind: str) -> None:
    reply = llm(server.base_url, way, kind).as_structured_llm(Person).chat(HI)
    assert isinstance(reply.raw, Person)


def test_a_500(way: str) -> None:
    with failing("500") as target, pytest.raises(openai.InternalServerError) as raised:
        llm(target.base_url, way, max_retries=0).chat(HI)
    assert raised.value.status_code == 500
    if way == "stormguard_client":
        assert isinstance(raised.value, stormguard.InternalServerError)
    assert target.requests == alone("500")


def test_a_shed_with_retry_after(way: str) -> None:
    with failing("shed") as target, pytest.raises(openai.InternalServerError) as raised:
        llm(target.base_url, way, max_retries=0).chat(HI)
    assert raised.value.status_code == 503
    assert target.requests == alone("shed")


def test_a_refused_connection(way: str) -> None:
    with failing("refused") as target, pytest.raises(openai.APIConnectionError) as raised:
        llm(target.base_url, way, max_retries=0).chat(HI)
    assert isinstance(raised.value, stormguard.APIConnectionError)
    assert target.requests == alone("refused")  # the connections tried


def test_a_crash_after_the_first_chunk(way: str) -> None:
    deltas: list[str] = []
    with failing("crash") as target, pytest.raises(openai.APIConnectionError) as raised:
        for reply in llm(target.base_url, way, max_retries=0).stream_chat(HI):
            deltas.append(reply.delta or "")
    assert deltas == [FIRST_CHUNK]  # what came before the crash; then an error, not an end
    assert isinstance(raised.value, stormguard.StreamInterruptedError)
    assert target.requests == alone("crash") == 1


def test_its_own_retries_at_their_default_stack_on_stormguards() -> None:
    """What ``max_retries=0`` turns off: at LlamaIndex's default (3) each failing call
    is made again as a new one, after a wait of at least 1 s (either way of wiring)."""
    with failing("500") as target, pytest.raises(openai.InternalServerError):
        llm(target.base_url, "stormguard_client").chat(HI)
    assert target.requests > alone("500")
    assert target.elapsed > 1.0
