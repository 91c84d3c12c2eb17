"""What a closed client does with a call: it refuses it at once, with a typed error,
sending nothing; which clients a ``close()`` closes. (Calls in flight ended by a
close: tests/e2e/test_client_lifecycle.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import respx

import stormguard
from tests.sdk.helpers import MESSAGES, Api, chat_json


def _http(api: Api, seen: list[httpx.Request]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=chat_json())

    transport = httpx.MockTransport(handler)
    if api.mode == "sync":
        return httpx.Client(transport=transport)
    return httpx.AsyncClient(transport=transport)


async def _closed(api: Api, client: Any) -> stormguard.ClientClosedError:
    with pytest.raises(stormguard.ClientClosedError) as caught:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    return caught.value


async def test_a_closed_client_refuses_a_call_at_once_sending_nothing(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client()
    await api.run(client.close())
    error = await _closed(api, client)
    assert isinstance(error, stormguard.APIConnectionError)  # openai-python's class for it
    assert "closed" in str(error) and error.request is None
    assert route.calls.call_count == 0
    assert client.stats().logical_calls == 0


async def test_closing_a_with_options_copy_closes_the_copy_and_not_the_pool(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client()
    copy = client.with_options(timeout=5)
    await api.run(copy.close())
    await _closed(api, copy)
    await api.run(client.chat.completions.create(messages=MESSAGES))  # its pool is open
    later = client.with_options(timeout=5)
    await api.run(client.close())  # the pool closes under every copy
    await _closed(api, later)
    assert route.calls.call_count == 1


async def test_closing_leaves_your_http_client_open_and_refuses_calls(api: Api) -> None:
    seen: list[httpx.Request] = []
    http = _http(api, seen)
    client = api.client(http_client=http)
    await api.run(client.close())
    assert not http.is_closed  # yours: closed when you close it
    await _closed(api, client)
    other = api.client(http_client=http)
    await api.run(other.chat.completions.create(messages=MESSAGES))
    await api.run(http.close() if api.mode == "sync" else http.aclose())
    error = await _closed(api, other)  # not httpx's bare RuntimeError
    assert "closed" in str(error)
    assert len(seen) == 1


async def test_a_closed_clients_error_is_openais_too_when_asked(api: Api) -> None:
    client = api.client(openai_errors=True)
    await api.run(client.close())
    error = await _closed(api, client)
    assert isinstance(error, openai.APIConnectionError)


def test_the_closed_error_is_the_callers_doing_for_every_policy() -> None:
    policy = stormguard.RetryPolicy()
    decision = policy.decide(stormguard.ClientClosedError())
    assert (decision.retry, decision.reason) == (False, "cancelled")
    decision = policy.decide(stormguard.EventLoopMismatchError("loop"))
    assert (decision.retry, decision.reason) == (False, "not_retryable")
