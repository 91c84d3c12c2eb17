"""The pipeline as an httpx transport under the real openai package (sync and async)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import respx

import stormguard
from stormguard import RetryBudget
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import BASE, MESSAGES, chat_json, chunk, event_stream, sse


class Oai:
    """An openai client (sync or async) over stormguard's transport."""

    def __init__(self, mode: str, **options: Any) -> None:
        self.mode = mode
        self.clock = FakeClock()
        options.setdefault("base_url", BASE)
        options.setdefault("clock", self.clock)
        options.setdefault(
            "retry_budget", RetryBudget(ratio=1.0, min_retries_per_second=10, clock=self.clock)
        )
        if mode == "sync":
            self.http: Any = stormguard.httpx_client(**options)
            self.client: Any = openai.OpenAI(
                base_url=BASE, api_key="sk-openai", http_client=self.http, max_retries=0
            )
        else:
            self.http = stormguard.async_httpx_client(**options)
            self.client = openai.AsyncOpenAI(
                base_url=BASE, api_key="sk-openai", http_client=self.http, max_retries=0
            )

    @property
    def stats(self) -> stormguard.CallStats:
        return self.http._transport.client.stats()

    async def chat(self, **kwargs: Any) -> Any:
        kwargs.setdefault("model", "m")
        kwargs.setdefault("messages", MESSAGES)
        result = self.client.chat.completions.create(**kwargs)
        return await result if self.mode == "async" else result

    async def collect(self, stream: Any) -> list[Any]:
        if self.mode == "sync":
            return list(stream)
        return [c async for c in stream]


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def mock() -> Any:
    with respx.mock(assert_all_called=False) as router:
        yield router


async def test_retries_are_stormguards_and_budgeted(mode: str, mock: respx.MockRouter) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[
            httpx.Response(502, json={}, headers={"retry-after": "1"}),
            httpx.Response(200, json=chat_json("hi")),
        ]
    )
    oai = Oai(mode)
    resp = await oai.chat(max_tokens=5)
    assert resp.choices[0].message.content == "hi"
    assert [c.request.headers["x-stormguard-attempt"] for c in route.calls] == ["1", "2"]
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-openai"
    assert json.loads(route.calls.last.request.content)["max_tokens"] == 5
    assert oai.clock.sleeps == [1.0]
    assert (oai.stats.logical_calls, oai.stats.attempts) == (1, 2)


async def test_a_shed_is_requeued_under_openai_with_its_attempt_number(
    mode: str, mock: respx.MockRouter
) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[
            httpx.Response(503, json={}, headers={"x-load-shed": "queue_full", "retry-after": "1"}),
            httpx.Response(200, json=chat_json("hi")),
        ]
    )
    oai = Oai(mode)
    resp = await oai.chat()
    assert resp.choices[0].message.content == "hi"
    sent = [c.request.headers for c in route.calls]
    assert [h["x-stormguard-attempt"] for h in sent] == ["1", "1"]  # never processed
    assert "x-stormguard-requeue" not in sent[0] and sent[1]["x-stormguard-requeue"] == "1"
    # The only call in flight: the shed came from load this client does not make,
    # so the server's Retry-After is honoured.
    assert oai.clock.sleeps == [1.0]
    assert (oai.stats.attempts, oai.stats.retries, oai.stats.requeues) == (2, 0, 1)


async def test_final_error_is_openais_own_class_with_the_body(
    mode: str, mock: respx.MockRouter
) -> None:
    mock.post(f"{BASE}/chat/completions").respond(
        429,
        json={"error": {"message": "slow down", "type": "rate"}},
        headers={"x-queue-depth": "9"},
    )
    oai = Oai(mode)
    with pytest.raises(openai.RateLimitError) as info:
        await oai.chat()
    assert "slow down" in str(info.value)
    assert info.value.response.headers["x-queue-depth"] == "9"
    # The first 429 is requeued (paid from the requeue budget's floor), then stormguard
    # makes its 3 attempts; openai makes none of its own.
    assert (oai.stats.attempts, oai.stats.requeues) == (4, 1)


async def test_budget_stops_retries_under_openai(mode: str, mock: respx.MockRouter) -> None:
    route = mock.post(f"{BASE}/chat/completions").respond(500, json={})
    oai = Oai(mode, retry_budget=RetryBudget(ratio=0.0, min_retries_per_second=0.0))
    with pytest.raises(openai.InternalServerError):
        await oai.chat()
    assert route.call_count == 1
    assert oai.stats.retries_refused_by_budget == 1


async def test_streams_pass_through_byte_for_byte(mode: str, mock: respx.MockRouter) -> None:
    body = sse(chunk("a"), chunk("b"), chunk("c"))
    mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[httpx.Response(502, json={}), event_stream(body)]
    )
    oai = Oai(mode)
    stream = await oai.chat(stream=True)
    chunks = await oai.collect(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["a", "b", "c"]
    assert oai.stats.attempts == 2


async def test_context_window_refusal_is_a_400_before_any_request(
    mode: str, mock: respx.MockRouter
) -> None:
    route = mock.post(f"{BASE}/chat/completions").respond(200, json=chat_json())
    policy = TokenPolicy(
        server_context_windows=False, server_tokenize=False, context_windows={"m": 20}
    )
    oai = Oai(mode, token_policy=policy)
    with pytest.raises(openai.BadRequestError) as info:
        await oai.chat(messages=[{"role": "user", "content": "word " * 100}], max_tokens=10)
    assert route.call_count == 0
    assert info.value.code == "context_length_exceeded"
    assert info.value.response.headers["x-should-retry"] == "false"


async def test_connection_failure_is_openais_connection_error(
    mode: str, mock: respx.MockRouter
) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
    oai = Oai(mode, retry_policy=stormguard.RetryPolicy(max_attempts=2))
    with pytest.raises(openai.APIConnectionError):
        await oai.chat()
    assert route.call_count == 2


async def test_models_list_and_urls_outside_the_endpoints(
    mode: str, mock: respx.MockRouter
) -> None:
    mock.get(f"{BASE}/models").respond(200, json={"object": "list", "data": [{"id": "m"}]})
    elsewhere = mock.get("http://other.test/v1/models").respond(
        200, json={"object": "list", "data": [{"id": "x"}]}
    )
    oai = Oai(mode)
    page = oai.client.models.list()
    page = await page if mode == "async" else page
    assert [m.id for m in page.data] == ["m"]
    other = (openai.OpenAI if mode == "sync" else openai.AsyncOpenAI)(
        base_url="http://other.test/v1", api_key="k", http_client=oai.http, max_retries=0
    )
    page = other.models.list()
    page = await page if mode == "async" else page
    assert [m.id for m in page.data] == ["x"]
    assert elsewhere.call_count == 1
