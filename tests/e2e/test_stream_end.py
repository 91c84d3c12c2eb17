"""Streams that end without ``data: [DONE]``, from a real server on loopback.

Several OpenAI-compatible servers and proxies end a complete stream with the
end of its body instead. Such a stream, each of whose choices has its
``finish_reason``, is complete: no error, no cut counted against the
endpoint's concurrency limit, no pause. A stream cut before its choices
finished is a cut, which lowers the limit but never pauses the endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

import stormguard
from tests.e2e.hostile_server import HostileServer, answer

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "ping"}]
SSE = [("content-type", "text/event-stream")]


def chunk(content: str, finish: str | None = None) -> str:
    choices = [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": choices}
    return f"data: {json.dumps(body)}\n\n"


COMPLETE = chunk("hel") + chunk("lo", "stop")  # no [DONE]: the body ends
CUT = chunk("hel") + chunk("lo")  # no finish_reason either


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer(
        {"/v1/complete/chat/completions": answer(200, COMPLETE, SSE),
         "/v1/cut/chat/completions": answer(200, CUT, SSE)}
    ) as running:  # fmt: skip
        yield running


def test_complete_streams_without_done_from_six_threads_all_succeed(server: HostileServer) -> None:
    limiter = stormguard.ConcurrencyLimiter(initial_limit=4)
    url = f"{server.origin}/v1/complete"
    with stormguard.Client(base_url=url, model="m", timeout=30, concurrency=limiter) as client:

        def call(_: int) -> str:
            stream = client.chat.completions.create(messages=MESSAGES, stream=True)
            return "".join(c.choices[0].delta.content for c in stream)

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(call, range(60)))
    assert texts == ["hello"] * 60
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 0, 0.0)


async def test_complete_streams_without_done_succeed_on_the_async_client(
    server: HostileServer,
) -> None:
    limiter = stormguard.ConcurrencyLimiter(initial_limit=4)
    url = f"{server.origin}/v1/complete"
    async with stormguard.AsyncClient(
        base_url=url, model="m", timeout=30, concurrency=limiter
    ) as client:
        for _ in range(10):
            stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
            assert "".join([c.choices[0].delta.content async for c in stream]) == "hello"
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 0, 0.0)


def test_openai_on_the_transport_reads_complete_streams_without_done_as_successes(
    server: HostileServer,
) -> None:
    limiter = stormguard.ConcurrencyLimiter(initial_limit=4)
    url = f"{server.origin}/v1/complete"
    http = stormguard.httpx_client(base_url=url, model="m", timeout=30, concurrency=limiter)
    with openai.OpenAI(base_url=url, api_key="k", http_client=http, max_retries=0) as oai:
        for _ in range(10):
            stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream) == "hello"
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 0, 0.0)


def test_streams_cut_mid_way_lower_the_limit_and_never_pause_the_endpoint(
    server: HostileServer,
) -> None:
    limiter = stormguard.ConcurrencyLimiter(initial_limit=4)
    url = f"{server.origin}/v1/cut"
    with stormguard.Client(base_url=url, model="m", timeout=30, concurrency=limiter) as client:
        for _ in range(8):
            stream = client.chat.completions.create(messages=MESSAGES, stream=True)
            with pytest.raises(stormguard.StreamInterruptedError):
                list(stream)
            state = limiter.state()[0]
            assert (state.in_flight, state.paused_for) == (0, 0.0)
    assert state.limit == 1


@pytest.mark.parametrize("wiring", ["transport", "openai_client"])
def test_openai_gets_a_stream_cut_mid_way_as_an_error_not_a_short_answer(
    server: HostileServer, wiring: str
) -> None:
    """A body that ends before its choices finished, with no ``[DONE]``: openai-python
    on its own ends such a stream quietly, and the caller (a framework) takes the half
    answer for the whole. Over stormguard it raises the call's own error, as
    ``stormguard.Client`` does, after the chunks that came."""
    url = f"{server.origin}/v1/cut"
    oai: openai.OpenAI
    if wiring == "transport":
        http = stormguard.httpx_client(base_url=url, model="m", timeout=30)
        oai = openai.OpenAI(base_url=url, api_key="k", http_client=http)
    else:
        oai = stormguard.OpenAI(base_url=url, api_key="k", timeout=30)
    received: list[str] = []
    with oai, pytest.raises(openai.APIConnectionError) as info:
        for c in oai.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            received.append(c.choices[0].delta.content or "")
    assert received == ["hel", "lo"]
    assert isinstance(info.value, stormguard.StreamInterruptedError)
    assert "before [DONE]" in str(info.value)
    # as every openai error, it has a request: LangChain builds its own error from it
    openai.APIConnectionError(message=info.value.message, request=info.value.request)
    assert len(server.requests_to("/v1/cut/chat/completions")) == 1


def test_openai_gets_a_json_200_to_a_stream_as_a_502_with_the_reason() -> None:
    """On its own, openai-python reads a JSON 200 to ``stream=True`` as an empty
    stream; on stormguard's transport it raises ``InternalServerError`` (502) that
    says what the server sent, where it once raised ``APIConnectionError:
    Connection error.``."""
    completion = {"id": "c", "object": "chat.completion", "model": "m", "choices": []}
    with HostileServer({"/v1/chat/completions": answer(200, completion)}) as running:
        url = running.base_url
        with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as plain:
            stream = plain.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            assert list(stream) == []
        http = stormguard.httpx_client(base_url=url, model="m", timeout=30)
        oai = openai.OpenAI(base_url=url, api_key="k", http_client=http, max_retries=0)
        with oai, pytest.raises(openai.InternalServerError) as info:
            oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert info.value.status_code == 502
        assert "Expected an event stream, got content-type 'application/json'" in str(info.value)
        assert len(running.requests_to("/v1/chat/completions")) == 2  # one each: no retry
