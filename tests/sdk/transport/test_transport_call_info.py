"""Each response the transport hands openai-python carries the call's CallInfo in
``response.extensions["stormguard"]``: success, a final error status, a refusal
before any I/O, a stream; and the typed client's raw responses carry it too."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import respx

import stormguard
from stormguard import CALL_INFO_EXTENSION, CallInfo, RetryPolicy, StopReason
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import BASE, MESSAGES, chat_json, chunk, event_stream, sse
from tests.sdk.transport import test_transport
from tests.sdk.transport.test_transport import Oai

mode, mock = test_transport.mode, test_transport.mock  # the fixtures


async def _raw_chat(oai: Oai, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "m")
    kwargs.setdefault("messages", MESSAGES)
    raw = oai.client.chat.completions.with_raw_response.create(**kwargs)
    return await raw if oai.mode == "async" else raw


def _info(raw: Any) -> CallInfo:
    info = raw.http_response.extensions[CALL_INFO_EXTENSION]
    assert isinstance(info, CallInfo)
    return info


async def test_a_success_after_a_retry_says_two_attempts(mode: str, mock: respx.MockRouter) -> None:
    mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[
            httpx.Response(502, json={}),
            httpx.Response(
                200, json=chat_json("hi"), headers={"x-queue-depth": "3", "x-request-id": "r-2"}
            ),
        ]
    )
    raw = await _raw_chat(Oai(mode))
    assert raw.parse().choices[0].message.content == "hi"
    info = _info(raw)
    assert info.attempts == 2
    assert [record.outcome for record in info.attempt_history] == ["retry", "ok"]
    assert info.attempt_history[0].status_code == 502
    assert info.stop_reason is None
    assert info.server_load.queue_depth == 3
    assert info.request_id == "r-2"
    assert info.model == "m"


async def test_a_final_error_status_says_why_retrying_stopped(
    mode: str, mock: respx.MockRouter
) -> None:
    mock.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(500, json={"error": {"message": "broken"}})
    )
    oai = Oai(mode, retry_policy=RetryPolicy(max_attempts=3))
    with pytest.raises(openai.InternalServerError) as caught:
        await oai.chat()
    response = caught.value.response
    info = response.extensions[CALL_INFO_EXTENSION]
    assert response.status_code == 500
    assert info.attempts == 3
    assert info.stop_reason == StopReason.MAX_ATTEMPTS


async def test_a_refusal_before_any_io_says_no_attempt_was_made(
    mode: str, mock: respx.MockRouter
) -> None:
    route = mock.post(f"{BASE}/chat/completions")
    policy = TokenPolicy(
        server_context_windows=False, server_tokenize=False, context_windows={"m": 20}
    )
    oai = Oai(mode, token_policy=policy)
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.chat(messages=[{"role": "user", "content": "word " * 100}], max_tokens=10)
    response = caught.value.response
    info = response.extensions[CALL_INFO_EXTENSION]
    assert response.status_code == 400
    assert info.attempts == 0
    assert info.attempt_history == () and info.model == "m"
    assert route.call_count == 0


async def test_a_stream_carries_its_attempts(mode: str, mock: respx.MockRouter) -> None:
    mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[
            httpx.Response(502, json={}),
            event_stream(sse(chunk("a"), chunk("b"))),
        ]
    )
    oai = Oai(mode)
    raw = await _raw_chat(oai, stream=True)
    chunks = await oai.collect(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "ab"
    assert _info(raw).attempts == 2


def test_the_typed_clients_raw_response_carries_it_too() -> None:
    clock = FakeClock()
    with respx.mock() as router:
        router.post(f"{BASE}/chat/completions").mock(
            side_effect=[httpx.Response(502, json={}), httpx.Response(200, json=chat_json())]
        )
        client = stormguard.Client(base_url=BASE, model="m", clock=clock)
        raw = client.chat.completions.with_raw_response.create(messages=MESSAGES)
        info = raw.http_response.extensions[CALL_INFO_EXTENSION]
        assert info is raw.parse().call_info
        assert info.attempts == 2
