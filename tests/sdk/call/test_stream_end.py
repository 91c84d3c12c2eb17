"""How a stream ends: complete, or cut.

A chat or completions stream is complete at ``data: [DONE]``, or at a clean end
of its body once every choice the request asked for (``n``, 1 by default) has
had its ``finish_reason``: several OpenAI-compatible servers and proxies end
their streams that way, and openai-python and LiteLLM read such a stream as
complete. A Responses API stream is complete at its last event. Anything else
is a cut; a cut after the first chunk lowers the concurrency limit but never
pauses the endpoint (it is no refusal).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

import stormguard
from stormguard import ConcurrencyLimiter
from tests.sdk.helpers import BASE, MESSAGES, Api, chunk, event_stream, sse


def finished(content: str, reason: str = "stop", index: int = 0) -> str:
    """A chunk that ends choice ``index``."""
    body = json.loads(chunk(content))
    body["choices"] = [{"index": index, "delta": {"content": content}, "finish_reason": reason}]
    return json.dumps(body)


def choice(content: str, index: int) -> str:
    body = json.loads(chunk(content))
    body["choices"][0]["index"] = index
    return json.dumps(body)


def text_chunk(text: str, reason: str | None = None, index: int = 0) -> str:
    choices = [{"index": index, "text": text, "finish_reason": reason}]
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": choices})


USAGE = json.dumps(
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
)

TWO_CHOICES = (choice("a", 0), choice("b", 1), finished("", index=1), finished("", index=0))

#: Complete without [DONE]: every choice asked for has its finish_reason.
COMPLETE_CHAT = {
    "one choice": ({}, sse(chunk("hel"), finished("lo"), done=False)),
    "then the usage": ({}, sse(chunk("hel"), finished("lo", "length"), USAGE, done=False)),
    "two choices": ({"n": 2}, sse(*TWO_CHOICES, done=False)),
    "finish and content in one chunk": ({}, sse(finished("hello"), done=False)),
}

#: Cut: a choice asked for has no finish_reason, or the body ends inside an event.
CUT_CHAT = {
    "no finish_reason": ({}, sse(chunk("hel"), chunk("lo"), done=False)),
    "one of two choices": ({"n": 2}, sse(choice("a", 0), finished("", index=0), done=False)),
    "one choice twice": ({"n": 2}, sse(finished("a", index=0), finished("b", index=0), done=False)),
    "in the middle of an event": ({}, sse(finished("lo"), done=False) + b'data: {"choi'),
    "a null finish_reason": ({}, sse(chunk("a", choices=[{"index": 0, "delta": {}}]), done=False)),
}


@pytest.mark.parametrize(("extra", "body"), COMPLETE_CHAT.values(), ids=COMPLETE_CHAT.keys())
async def test_a_chat_stream_whose_choices_all_finished_is_complete_without_done(
    api: Api, mock: respx.MockRouter, extra: dict[str, Any], body: bytes
) -> None:
    mock.post("/chat/completions").mock(side_effect=lambda request: event_stream(body))
    limiter = ConcurrencyLimiter(initial_limit=4, clock=api.clock)
    client = api.client(concurrency=limiter)
    for _ in range(3):  # the same again: no pause, no decrease comes of it
        stream = await api.run(
            client.chat.completions.create(messages=MESSAGES, stream=True, **extra)
        )
        chunks = await api.collect(stream)
        assert stream.chunks_received == len(chunks) >= 1
        assert stream.response.is_closed
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 0, 0.0)


async def test_a_completions_stream_whose_choice_finished_is_complete_without_done(
    api: Api, mock: respx.MockRouter
) -> None:
    body = sse(text_chunk("a"), text_chunk("b", "stop"), done=False)
    mock.post("/completions").mock(return_value=event_stream(body))
    stream = await api.run(api.client().completions.create(prompt="p", stream=True))
    assert [c.choices[0].text for c in await api.collect(stream)] == ["a", "b"]


async def test_a_completions_stream_without_a_finish_reason_is_cut(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/completions").mock(return_value=event_stream(sse(text_chunk("a"), done=False)))
    stream = await api.run(api.client().completions.create(prompt="p", stream=True))
    with pytest.raises(stormguard.StreamInterruptedError, match="before \\[DONE\\]"):
        await api.collect(stream)


@pytest.mark.parametrize(("extra", "body"), CUT_CHAT.values(), ids=CUT_CHAT.keys())
async def test_a_chat_stream_with_a_choice_unfinished_is_cut(
    api: Api, mock: respx.MockRouter, extra: dict[str, Any], body: bytes
) -> None:
    mock.post("/chat/completions").mock(return_value=event_stream(body))
    client = api.client()
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True, **extra))
    got: list[Any] = []
    with pytest.raises(stormguard.StreamInterruptedError, match="before \\[DONE\\]") as info:
        if api.mode == "sync":
            got.extend(stream)
        else:
            async for item in stream:
                got.append(item)
    assert info.value.chunks_received == len(got) >= 1
    assert stream.response.is_closed


async def test_streams_cut_after_their_first_chunk_lower_the_limit_but_never_pause_it(
    api: Api, mock: respx.MockRouter
) -> None:
    """A cut is no refusal: the server took the call. It lowers the limit (the
    server lost work it had begun), down to the floor for a run of them, but the
    endpoint is never paused for it, as it is for a shed at the floor."""
    cut = sse(chunk("a"), chunk("b"), done=False)
    mock.post("/chat/completions").mock(side_effect=lambda request: event_stream(cut))
    limiter = ConcurrencyLimiter(initial_limit=4, clock=api.clock)
    client = api.client(concurrency=limiter)
    for _ in range(6):
        stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
        with pytest.raises(stormguard.StreamInterruptedError):
            await api.collect(stream)
        state = limiter.state()[0]
        assert (state.in_flight, state.paused_for) == (0, 0.0)
    assert state.limit == 1  # a run of cuts with nothing in flight: down to the floor


@pytest.mark.parametrize(
    ("body", "decreases"),
    [(COMPLETE_CHAT["then the usage"][1], 0), (CUT_CHAT["no finish_reason"][1], 1)],
    ids=["complete", "cut"],
)
async def test_with_streaming_response_judges_the_end_of_the_bytes_it_hands_on(
    api: Api, mock: respx.MockRouter, body: bytes, decreases: int
) -> None:
    mock.post("/chat/completions").mock(return_value=event_stream(body))
    limiter = ConcurrencyLimiter(initial_limit=4, clock=api.clock)
    create = api.client(concurrency=limiter).chat.completions.with_streaming_response.create
    manager = create(messages=MESSAGES, stream=True)
    if api.mode == "sync":
        with manager as response:
            lines = list(response.iter_lines())
    else:
        async with manager as response:
            lines = [line async for line in response.iter_lines()]
    assert b"".join(line.encode() + b"\n" for line in lines) == body
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, decreases, 0.0)


# -- transport mode: openai-python on stormguard.httpx_client --------------------------


def _openai(body: bytes, limiter: ConcurrencyLimiter) -> Any:
    openai = pytest.importorskip("openai")

    def handler(request: httpx.Request) -> httpx.Response:
        return event_stream(body)

    http = stormguard.httpx_client(
        base_url=BASE,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        concurrency=limiter,
    )
    return openai.OpenAI(base_url=BASE, api_key="k", http_client=http, max_retries=0)


@pytest.mark.parametrize(("extra", "body"), COMPLETE_CHAT.values(), ids=COMPLETE_CHAT.keys())
def test_openai_on_the_transport_a_complete_stream_without_done_is_a_success(
    extra: dict[str, Any], body: bytes
) -> None:
    limiter = ConcurrencyLimiter(initial_limit=4)
    oai = _openai(body, limiter)
    for _ in range(3):
        got = list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True, **extra))
        assert got
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 0, 0.0)


@pytest.mark.parametrize(("extra", "body"), CUT_CHAT.values(), ids=CUT_CHAT.keys())
def test_openai_on_the_transport_an_unfinished_stream_without_done_is_a_cut(
    extra: dict[str, Any], body: bytes
) -> None:
    limiter = ConcurrencyLimiter(initial_limit=4)
    oai = _openai(body, limiter)
    # openai-python on its own would end the stream quietly, a half answer taken for
    # the whole: it gets the call's error, and stormguard counts the cut
    with pytest.raises(stormguard.StreamInterruptedError) as info:
        list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True, **extra))
    assert isinstance(info.value, pytest.importorskip("openai").APIConnectionError)
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 1, 0.0)


def test_openai_on_the_transport_a_responses_stream_ends_at_its_last_event() -> None:
    from tests.sdk.client.test_endpoints_responses import events, stream_of

    limiter = ConcurrencyLimiter(initial_limit=4)
    oai = _openai(events(*stream_of("he", "llo")), limiter)
    got = list(oai.responses.create(model="m", input="hi", stream=True))
    assert got[-1].type == "response.completed"
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases) == (0, 0)

    limiter = ConcurrencyLimiter(initial_limit=4)
    oai = _openai(events(*stream_of("he", "llo")[:-1]), limiter)  # no last event: a cut
    with pytest.raises(stormguard.StreamInterruptedError):
        list(oai.responses.create(model="m", input="hi", stream=True))
    state = limiter.state()[0]
    assert (state.in_flight, state.decreases, state.paused_for) == (0, 1, 0.0)
