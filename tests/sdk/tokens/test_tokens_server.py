"""ServerTokenizeCounter: vLLM's /tokenize, cached, with a fallback when it fails."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from stormguard.tokens import (
    EstimatingCounter,
    ServerTokenizeCounter,
    TokenCount,
    run_precheck_async,
    run_precheck_sync,
)
from stormguard.tokens._flow import MAX_LOOKUP_ENDPOINTS
from stormguard.tokens._lru import LRUCache
from stormguard.tokens._request import read_request
from stormguard.tokens._server_context_windows import ServerContextWindows
from stormguard.tokens._server_counter import parse_tokenize_response
from tests.sdk.tokens.test_tokens_support import FakeClock

BASE = "http://vllm.test/v1"
TOKENIZE = "http://vllm.test/tokenize"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}


def _answer(count: int, max_model_len: int | None = 4096) -> httpx.Response:
    body: dict[str, object] = {"count": count, "tokens": list(range(count))}
    if max_model_len is not None:
        body["max_model_len"] = max_model_len
    return httpx.Response(200, json=body)


def _count(
    counter: ServerTokenizeCounter, body: dict[str, object], kind: str = "chat"
) -> TokenCount:
    request = read_request("chat" if kind == "chat" else "completion", body)
    with httpx.Client() as client:
        return run_precheck_sync(counter.count_flow(request, model="llama", base_url=BASE), client)


@respx.mock
def test_chat_is_tokenized_at_the_server_root_with_the_vllm_payload() -> None:
    route = respx.post(TOKENIZE).mock(return_value=_answer(17))
    tools = [{"type": "function", "function": {"name": "f"}}]
    result = _count(ServerTokenizeCounter(), {**CHAT, "tools": tools})
    assert result == TokenCount(17, "server:/tokenize", 4096)
    sent = json.loads(route.calls.last.request.content)
    assert sent == {
        "model": "llama",
        "messages": CHAT["messages"],
        "add_generation_prompt": True,
        "tools": tools,
    }


@respx.mock
def test_a_completion_prompt_is_sent_as_prompt() -> None:
    route = respx.post(TOKENIZE).mock(return_value=_answer(3, max_model_len=None))
    result = _count(ServerTokenizeCounter(), {"prompt": "a b c"}, kind="completion")
    assert result == TokenCount(3, "server:/tokenize", None)
    assert json.loads(route.calls.last.request.content) == {"model": "llama", "prompt": "a b c"}


@respx.mock
def test_results_are_cached_by_input() -> None:
    route = respx.post(TOKENIZE).mock(return_value=_answer(9))
    counter = ServerTokenizeCounter()
    assert _count(counter, CHAT).tokens == 9
    assert _count(counter, CHAT).tokens == 9
    assert route.call_count == 1
    _count(counter, {"messages": [{"role": "user", "content": "other"}]})
    assert route.call_count == 2


@respx.mock
async def test_the_async_driver_runs_the_same_flow() -> None:
    respx.post(TOKENIZE).mock(return_value=_answer(11))
    counter = ServerTokenizeCounter()
    flow = counter.count_flow(read_request("chat", CHAT), model="llama", base_url=BASE)
    async with httpx.AsyncClient() as client:
        assert (await run_precheck_async(flow, client)).tokens == 11


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.Response(404, json={"detail": "Not Found"}),
        httpx.Response(503),
        httpx.Response(200, text="<html>proxy</html>"),
        httpx.Response(200, json={"count": "many"}),
        httpx.Response(200, json={"count": 3, "tokens": [1, 2]}),
    ],
)
@respx.mock
def test_failures_fall_back_and_rest_the_endpoint(failure: object) -> None:
    if isinstance(failure, Exception):
        route = respx.post(TOKENIZE).mock(side_effect=failure)
    else:
        route = respx.post(TOKENIZE).mock(return_value=failure)
    clock = FakeClock()
    fallback = EstimatingCounter()
    counter = ServerTokenizeCounter(fallback, retry_after=30, clock=clock)
    expected = fallback.count_messages(CHAT["messages"])  # type: ignore[arg-type]
    assert _count(counter, CHAT) == TokenCount(expected, "estimate:utf8-bytes")
    clock.advance(29)
    assert _count(counter, CHAT).counter == "estimate:utf8-bytes"
    assert route.call_count == 1  # no second request while the endpoint rests
    clock.advance(2)
    route.mock(return_value=_answer(5), side_effect=None)
    assert _count(counter, CHAT).tokens == 5


@respx.mock
def test_batches_are_not_sent_to_tokenize() -> None:
    route = respx.post(TOKENIZE).mock(return_value=_answer(1))
    result = _count(ServerTokenizeCounter(), {"prompt": ["aa", "bbbb"]}, kind="completion")
    assert result == TokenCount(4, "estimate:utf8-bytes")
    assert not route.called


def test_outside_a_flow_the_fallback_answers() -> None:
    counter = ServerTokenizeCounter(EstimatingCounter())
    assert counter.count_text("héllo") == 6
    assert counter.name == "server:/tokenize"


@pytest.mark.parametrize(
    ("response", "parsed"),
    [
        (None, None),
        (
            httpx.Response(200, json={"count": 2, "tokens": [1, 2], "max_model_len": 8192}),
            (2, 8192),
        ),
        (httpx.Response(200, json={"count": 0, "tokens": []}), (0, None)),
        (httpx.Response(200, json={"count": 2, "max_model_len": -1}), (2, None)),
        (httpx.Response(200, json={"count": 2, "max_model_len": "big"}), (2, None)),
        (httpx.Response(200, json={"count": True}), None),
        (httpx.Response(200, json={"count": -1}), None),
        (httpx.Response(200, json=[1, 2]), None),
        (httpx.Response(200, content=b"\xff"), None),
        (httpx.Response(400, json={"count": 2}), None),
    ],
)
def test_parse_tokenize_response(
    response: httpx.Response | None, parsed: tuple[int, int | None] | None
) -> None:
    assert parse_tokenize_response(response) == parsed


def test_lru_cache_is_bounded() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)
    with pytest.raises(ValueError):
        LRUCache(0)


def _drive(flow: Any, answer: httpx.Response | None) -> Any:
    """Run a lookup flow by hand, answering its one request with ``answer``."""
    try:
        next(flow)
        flow.send(answer)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the flow asked for a second lookup")


def test_the_endpoints_remembered_down_are_bounded() -> None:
    # A policy shared by clients of ever new servers (addresses that change with each
    # deploy): each one that failed a lookup is remembered, for retry_after seconds.
    clock = FakeClock()
    counter = ServerTokenizeCounter(clock=clock)
    request = read_request("chat", CHAT)
    for i in range(5_000):
        base = f"http://10.0.{i // 256}.{i % 256}:8000/v1"
        _drive(counter.count_flow(request, model="llama", base_url=base), None)
        assert len(counter._down_until) <= MAX_LOOKUP_ENDPOINTS
    latest = "http://10.0.19.135:8000/tokenize"
    assert not counter._available(latest)  # the most recent ones are kept
    clock.advance(counter.retry_after)
    assert counter._available(latest)


def test_the_context_windows_kept_per_endpoint_are_bounded() -> None:
    clock = FakeClock()
    windows = ServerContextWindows(clock=clock)
    listing = httpx.Response(200, json={"data": [{"id": "llama", "max_model_len": 8192}]})
    for i in range(5_000):
        base = f"http://10.0.{i // 256}.{i % 256}:8000/v1"
        assert _drive(windows.context_window_flow(base, "llama"), listing) == 8192
        assert len(windows._entries) <= MAX_LOOKUP_ENDPOINTS
    # The latest is still cached: no lookup.
    latest = windows.context_window_flow("http://10.0.19.135:8000/v1", "llama")
    with pytest.raises(StopIteration) as done:
        next(latest)
    assert done.value.value == 8192


def test_a_window_that_refused_a_call_is_looked_up_again_within_a_minute() -> None:
    # One endpoint's /v1/models answer is applied to every call of the model: a wrong
    # one (max_model_len 16) refuses calls locally for at most retry_after, not the ttl.
    from stormguard import ContextWindowExceededError
    from stormguard.tokens import TokenPolicy

    clock = FakeClock()
    policy = TokenPolicy(server_tokenize=False, clock=clock)
    lookups: list[str] = []

    def run(max_model_len: int) -> Any:
        listing = httpx.Response(
            200, json={"data": [{"id": "llama", "max_model_len": max_model_len}]}
        )
        flow = policy.precheck_flow("llama", "chat", CHAT, base_url=BASE)
        try:
            request = next(flow)
            while True:
                lookups.append(str(request.url))
                request = flow.send(listing)
        except StopIteration as stop:
            return stop.value

    with pytest.raises(ContextWindowExceededError):
        run(16)
    assert lookups == ["http://vllm.test/v1/models"]
    clock.advance(policy.server_context_windows.retry_after - 1)
    with pytest.raises(ContextWindowExceededError):
        run(8192)  # still the cached answer: no second lookup yet
    assert len(lookups) == 1
    clock.advance(1)
    assert run(8192).context_window == 8192  # looked up again: the right window
    assert len(lookups) == 2
    # A window that refuses nothing keeps its ttl.
    clock.advance(policy.server_context_windows.retry_after)
    assert run(8192).context_window == 8192
    assert len(lookups) == 2
