"""The pre-check's lookups run within the call's deadline and the size cap of its bodies."""

from __future__ import annotations

import gzip
import json
from collections.abc import Awaitable, Callable

import httpx
import pytest
import respx

from stormguard._core.deadline import Deadline
from stormguard.testing import FakeClock
from stormguard.tokens import (
    Flow,
    ServerTokenizeCounter,
    TokenCount,
    TokenPolicy,
    run_precheck_sync,
)
from stormguard.tokens._flow import drive_precheck_async, drive_precheck_sync
from stormguard.tokens._request import read_request
from tests.sdk.helpers import Api, chat_json

BASE = "http://vllm.test/v1"
TOKENIZE = "http://vllm.test/tokenize"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}
ANSWER = {"count": 3, "tokens": [1, 2, 3], "max_model_len": 4096}


Drive = Callable[..., Awaitable[TokenCount]]


def count_flow(timeout: float = 2.0) -> Flow[TokenCount]:
    counter = ServerTokenizeCounter(timeout=timeout)
    return counter.count_flow(read_request("chat", CHAT), model="llama", base_url=BASE)


@pytest.fixture(params=["sync", "async"])
def drive(request: pytest.FixtureRequest) -> Drive:
    """Runs a flow with the sync or the async driver, within a deadline and a cap."""

    async def run(
        flow: Flow[TokenCount], deadline: Deadline, max_bytes: int = 1 << 20
    ) -> TokenCount:
        if request.param == "sync":
            with httpx.Client() as client:
                return drive_precheck_sync(flow, client, deadline, max_bytes)
        async with httpx.AsyncClient() as aclient:
            return await drive_precheck_async(flow, aclient, deadline, max_bytes)

    return run


@respx.mock
async def test_a_lookup_gets_what_is_left_of_the_call_when_that_is_less(drive: Drive) -> None:
    route = respx.post(TOKENIZE).respond(200, json=ANSWER)
    clock = FakeClock()
    deadline = Deadline(clock, 10.0)
    clock.advance(9.7)
    result = await drive(count_flow(timeout=2.0), deadline)
    assert result.tokens == 3
    sent = route.calls.last.request.extensions["timeout"]
    assert sent == pytest.approx({"connect": 0.3, "read": 0.3, "write": 0.3, "pool": 0.3})


@respx.mock
async def test_a_lookup_keeps_its_own_timeout_within_a_longer_call(drive: Drive) -> None:
    route = respx.post(TOKENIZE).respond(200, json=ANSWER)
    await drive(count_flow(timeout=2.0), Deadline(FakeClock(), 60.0))
    assert route.calls.last.request.extensions["timeout"]["read"] == 2.0


@respx.mock
async def test_no_time_left_sends_no_lookup_and_the_fallback_counts(drive: Drive) -> None:
    route = respx.post(TOKENIZE).respond(200, json=ANSWER)
    clock = FakeClock()
    deadline = Deadline(clock, 1.0)
    clock.advance(1.0)
    result = await drive(count_flow(), deadline)
    assert route.call_count == 0
    assert result.counter == "estimate:utf8-bytes"


@respx.mock
async def test_a_lookup_body_over_the_cap_is_a_failed_lookup(drive: Drive) -> None:
    padding = {"padding": "x" * 5000, **ANSWER}
    respx.post(TOKENIZE).respond(200, json=padding)
    result = await drive(count_flow(), Deadline(FakeClock(), 60.0), max_bytes=4096)
    assert result.counter == "estimate:utf8-bytes"


@respx.mock
async def test_a_gzip_encoded_lookup_is_decoded_and_asked_for(drive: Drive) -> None:
    route = respx.post(TOKENIZE).respond(
        200,
        content=gzip.compress(json.dumps(ANSWER).encode()),
        headers={"content-encoding": "gzip", "content-type": "application/json"},
    )
    result = await drive(count_flow(), Deadline(FakeClock(), 60.0))
    assert (result.tokens, result.max_model_len) == (3, 4096)
    assert route.calls.last.request.headers["accept-encoding"] == "gzip, deflate"


@respx.mock
def test_the_public_driver_takes_a_total_timeout_and_a_cap() -> None:
    route = respx.post(TOKENIZE).respond(200, json=ANSWER)
    with httpx.Client() as client:
        result = run_precheck_sync(count_flow(timeout=2.0), client, timeout=0.5, max_bytes=10)
    assert route.calls.last.request.extensions["timeout"]["read"] <= 0.5
    assert result.counter == "estimate:utf8-bytes"  # 10 bytes: the answer is over the cap


async def test_the_client_caps_lookups_at_its_max_response_bytes(
    api: Api, mock: respx.MockRouter
) -> None:
    tokenize = mock.post("http://llm.test/tokenize").respond(
        200, json={"padding": "x" * 5000, **ANSWER}
    )
    chat = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(
        token_policy=TokenPolicy(server_context_windows=False), max_response_bytes=4096
    )
    resp = await api.run(client.chat.completions.create(messages=CHAT["messages"], max_tokens=5))
    assert tokenize.call_count == 1 and chat.call_count == 1
    assert resp.precheck.counter == "estimate:utf8-bytes"


def timing_out(clock: FakeClock, seconds: float) -> Callable[[httpx.Request], httpx.Response]:
    """A server that takes ``seconds`` (on the fake clock) and then times out."""

    def respond(request: httpx.Request) -> httpx.Response:
        clock.advance(seconds)
        raise httpx.ReadTimeout("timed out", request=request)

    return respond


@respx.mock
async def test_a_lookup_the_call_ran_out_of_time_for_does_not_mark_the_server_down(
    drive: Drive,
) -> None:
    clock = FakeClock()
    counter = ServerTokenizeCounter(timeout=2.0, clock=clock.now)
    route = respx.post(TOKENIZE).mock(side_effect=timing_out(clock, 0.5))
    flow = counter.count_flow(read_request("chat", CHAT), model="llama", base_url=BASE)
    result = await drive(flow, Deadline(clock, 0.5))  # the call's 0.5 s, not the 2 s lookup
    assert result.counter == "estimate:utf8-bytes"
    route.mock(return_value=httpx.Response(200, json=ANSWER))
    again = counter.count_flow(read_request("chat", CHAT), model="llama", base_url=BASE)
    assert (await drive(again, Deadline(clock, 60.0))).tokens == 3  # asked again at once


@respx.mock
async def test_a_lookup_past_its_own_timeout_marks_the_server_down(drive: Drive) -> None:
    clock = FakeClock()
    counter = ServerTokenizeCounter(timeout=2.0, clock=clock.now)
    route = respx.post(TOKENIZE).mock(side_effect=timing_out(clock, 2.0))
    flow = counter.count_flow(read_request("chat", CHAT), model="llama", base_url=BASE)
    assert (await drive(flow, Deadline(clock, 60.0))).counter == "estimate:utf8-bytes"
    route.mock(return_value=httpx.Response(200, json=ANSWER))
    again = counter.count_flow(read_request("chat", CHAT), model="llama", base_url=BASE)
    assert (await drive(again, Deadline(clock, 60.0))).counter == "estimate:utf8-bytes"
    assert route.call_count == 1  # not asked again while marked down
