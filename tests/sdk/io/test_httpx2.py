"""stormguard over an ``httpx2.Client`` (openai-python 3.x's HTTP library) given as
``http_client``, beside an imported httpx: the pipeline reads httpx2's responses and
errors as it reads httpx's, sync and async."""

from __future__ import annotations

import json
from typing import Any

import httpx
import httpx2
import pytest

import stormguard
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, local, sse


def _transport(api: Api, handler: Any) -> Any:
    transport = httpx2.MockTransport(handler)
    return (
        httpx2.Client(transport=transport)
        if api.mode == "sync"
        else httpx2.AsyncClient(transport=transport)
    )


async def test_a_call_is_retried_over_httpx2_and_reads_its_load_headers(api: Api) -> None:
    seen: list[Any] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx2.Response(503, headers={"retry-after": "0", "x-load-shed": "queue_full"})
        return httpx2.Response(200, json=chat_json("hi"), headers={"x-queue-depth": "3"})

    client = api.client(http_client=_transport(api, handler))
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert result.choices[0].message.content == "hi"
    assert result.attempts == 2
    assert result.server_load.queue_depth == 3
    assert all(isinstance(request, httpx2.Request) for request in seen)
    assert json.loads(seen[-1].content)["messages"] == MESSAGES
    await api.close_all()


async def test_a_stream_over_httpx2(api: Api) -> None:
    body = sse(chunk("a"), chunk("b"))

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = api.client(http_client=_transport(api, handler))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    chunks = await api.collect(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "ab"
    await api.close_all()


async def test_httpx2_connection_errors_are_the_calls_connection_errors(api: Api) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    client = api.client(
        http_client=_transport(api, handler), retry_policy=stormguard.RetryPolicy(max_attempts=2)
    )
    with pytest.raises(stormguard.APIConnectionError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert isinstance(info.value.__cause__, httpx2.ConnectError)
    assert info.value.attempts == 2
    await api.close_all()


async def test_httpx2_timeouts_are_the_calls_timeouts(api: Api) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("slow", request=request)

    client = api.client(
        http_client=_transport(api, handler), retry_policy=stormguard.RetryPolicy(max_attempts=1)
    )
    with pytest.raises(stormguard.APITimeoutError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    await api.close_all()


def test_the_attempts_timeout_reaches_httpx2_as_numbers() -> None:
    """httpx's Timeout object is a number to httpx2: each attempt's timeout travels as
    the dict both libraries read."""
    seen: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.extensions["timeout"])
        return httpx2.Response(200, json=chat_json())

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    with stormguard.Client(
        base_url="http://llm.test/v1", model="m", api_key="k", http_client=http, timeout=7
    ) as client:
        client.chat.completions.create(messages=MESSAGES)
    assert set(seen[0]) == {"connect", "read", "write", "pool"}
    assert all(value is None or isinstance(value, float) for value in seen[0].values())
    assert 0 < seen[0]["read"] <= 7


def test_connection_limits_of_either_library_and_a_clear_error_otherwise() -> None:
    limits = httpx2.Limits(max_connections=7, max_keepalive_connections=3)
    client = stormguard.Client(base_url="http://llm.test/v1", connection_limits=limits)
    pool = local(client._http._transport)._pool
    assert pool._max_connections == 7
    client.close()
    stormguard.Client(
        base_url="http://llm.test/v1", connection_limits=httpx.Limits(max_connections=5)
    ).close()
    with pytest.raises(TypeError, match=r"httpx\.Client or an httpx2\.Client, got AsyncClient"):
        stormguard.Client(base_url="http://llm.test/v1", http_client=httpx2.AsyncClient())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"connection_limits must be an httpx\.Limits"):
        stormguard.Client(base_url="http://llm.test/v1", connection_limits=7)  # type: ignore[arg-type]


def test_httpx_client_hands_openai_the_library_it_runs_on() -> None:
    """openai 3.x runs on httpx2: ``httpx_client()`` gives it an httpx2 client, and one
    of httpx's when asked by name; an unknown name is a clear error."""
    assert stormguard.openai_http_library() == "httpx2"
    native = stormguard.httpx_client(base_url="http://llm.test/v1")
    legacy = stormguard.httpx_client(library="httpx", base_url="http://llm.test/v1")
    assert isinstance(native, httpx2.Client) and isinstance(legacy, httpx.Client)
    native.close()
    legacy.close()
    with pytest.raises(ValueError, match="library must be"):
        stormguard.httpx_client(library="requests", base_url="http://llm.test/v1")  # type: ignore[call-overload]


def test_openai_errors_is_refused_under_the_transport() -> None:
    """Under openai-python, openai raises its own errors: the option would do nothing."""
    for make in (stormguard.httpx_client, stormguard.async_httpx_client):
        with pytest.raises(TypeError, match="openai-python raises its own errors"):
            make(base_url="http://llm.test/v1", openai_errors=True)
