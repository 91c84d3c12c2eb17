"""``stormguard.OpenAI``/``AsyncOpenAI`` where openai-python is installed: openai's own
clients over stormguard's pipeline, against the reference server and hostile ones.

What frameworks check is what these tests check: ``isinstance`` against openai's
clients and types, pydantic results (``model_dump()``, every field openai declares),
openai's stream and event classes, and errors that are openai's classes; and what
stormguard adds is still there: ``CallInfo``, shared resilience state, the call's
deadline, several endpoints, redaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent

import stormguard
from tests.e2e.hostile_server import HostileServer, answer, never_answer
from tests.e2e.key_echo import KEY, leaks
from tests.e2e.server_process import RunningServer, free_port, run_server

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
HI = [{"role": "user", "content": "hi"}]
ERROR_500 = {"error": {"message": "the engine failed", "type": "server_error"}}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[stormguard.OpenAI]:
    with stormguard.OpenAI(base_url=server.base_url, api_key="sk-test-key-12345678") as made:
        yield made


def test_results_streams_and_raw_responses_are_openais(client: stormguard.OpenAI) -> None:
    assert isinstance(client, openai.OpenAI)
    result = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8)
    assert isinstance(result, ChatCompletion)
    assert result.choices[0].message.content
    assert result.model_dump()["choices"][0]["message"]["audio"] is None
    info = stormguard.call_info(result)
    assert info is not None and info.attempts == 1 and info.request_id == result._request_id
    # model_dump() and copies do not carry it: it is not a field
    assert "_stormguard_call_info" not in result.model_dump_json()

    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, stream=True)
    chunks = list(stream)
    assert chunks and all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    stream_info = stormguard.call_info(stream)
    assert stream_info is not None and stream_info.attempts == 1

    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=8)
    raw_info = stormguard.call_info(raw)
    assert raw_info is not None and raw_info.attempts == 1
    assert raw.parse().choices[0].message.content
    assert client.stormguard.stats().logical_calls == 3


def test_responses_stream_events_are_openais_event_classes(client: stormguard.OpenAI) -> None:
    with client.responses.create(model=MODEL, input="hi", max_output_tokens=8, stream=True) as s:
        events = list(s)
    last = events[-1]
    assert isinstance(last, (ResponseCompletedEvent, ResponseIncompleteEvent))
    assert last.response.usage is not None and last.response.usage.output_tokens > 0


async def test_the_async_client(server: RunningServer) -> None:
    async with stormguard.AsyncOpenAI(base_url=server.base_url, api_key="sk-test-1") as client:
        assert isinstance(client, openai.AsyncOpenAI)
        result = await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8)
        assert isinstance(result, ChatCompletion)
        info = stormguard.call_info(result)
        assert info is not None and info.attempts == 1
        stream = await client.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=8, stream=True
        )
        first = await stream.__anext__()
        assert isinstance(first, ChatCompletionChunk)
        await stream.close()  # openai's name, on openai's AsyncStream


def test_with_options_shares_the_pipeline_and_maps_its_settings(
    client: stormguard.OpenAI,
) -> None:
    assert client.max_retries == client.stormguard.max_retries == 2  # RetryPolicy's default
    assert client.timeout == 120.0  # stormguard's total, not openai's 600 s per attempt
    same = client.with_options(timeout=30)
    assert same.stormguard is client.stormguard  # the deadline travels with each request
    fewer = client.with_options(max_retries=0)
    assert fewer.stormguard.max_retries == 0 and client.stormguard.max_retries == 2
    assert fewer.stormguard.retry_budget is client.stormguard.retry_budget
    fewer.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
    assert client.stormguard.stats().logical_calls == 1  # one set of counts


def test_stormguards_options_are_taken_and_openais_errors_option_is_moot(
    server: RunningServer,
) -> None:
    budget = stormguard.RetryBudget(ratio=0.5)
    with stormguard.OpenAI(
        base_url=server.base_url,
        api_key="sk-test-1",
        retry_policy=stormguard.RetryPolicy(max_attempts=5),
        retry_budget=budget,
        priority="sheddable",
        quota=None,
        openai_errors=True,
    ) as made:
        assert made.max_retries == 4 and made.stormguard.retry_budget is budget
        assert made.stormguard._core.quota is None
    with stormguard.OpenAI(base_url=server.base_url, api_key="k") as paced:
        assert paced.stormguard._core.quota is not None  # stormguard's default: on
    with pytest.raises(TypeError, match=r"stormguard\.Client"):
        stormguard.OpenAI(base_url=server.base_url, api_key="k", openai_errors=False)
    with pytest.raises(TypeError, match="not both"):
        stormguard.OpenAI(
            base_url=server.base_url,
            api_key="k",
            max_retries=1,
            retry_policy=stormguard.RetryPolicy(),
        )


def test_a_status_error_is_openais_and_stormguards_class() -> None:
    with (
        HostileServer({"/v1/chat/completions": answer(500, ERROR_500)}) as hostile,
        stormguard.OpenAI(base_url=hostile.base_url, api_key="sk-test-1") as client,
        pytest.raises(openai.InternalServerError) as raised,
    ):
        client.chat.completions.create(model=MODEL, messages=HI)
    error = raised.value
    assert isinstance(error, stormguard.InternalServerError)  # import stormguard as openai
    assert error.status_code == 500 and "the engine failed" in error.message
    assert error.attempts >= 1 and error.retry_stopped_by is not None
    info = stormguard.call_info(error)
    assert info is not None and info.attempts == error.attempts


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_refused_connection_fails_once_as_both_classes(kind: str) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    client: stormguard.OpenAI | stormguard.AsyncOpenAI
    with pytest.raises(openai.APIConnectionError) as raised:
        if kind == "sync":
            with stormguard.OpenAI(base_url=url, api_key="sk-test-1") as client:
                client.chat.completions.create(model=MODEL, messages=HI)
        else:
            async with stormguard.AsyncOpenAI(base_url=url, api_key="sk-test-1") as client:
                await client.chat.completions.create(model=MODEL, messages=HI)
    assert isinstance(raised.value, stormguard.APIConnectionError)
    assert raised.value.__cause__ is not None  # the connection's own error
    # openai-python's retries (2, after 0.5-2 s of sleeps) did not run on top: one
    # logical call, its attempts stormguard's alone
    stats = client.stormguard.stats()
    assert stats.logical_calls == 1 and stats.attempts == raised.value.attempts == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_timeout_is_the_calls_deadline(kind: str) -> None:
    with HostileServer({"/v1/chat/completions": never_answer()}) as hostile:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError) as raised:
            if kind == "sync":
                with stormguard.OpenAI(
                    base_url=hostile.base_url, api_key="sk-test-1", timeout=0.5
                ) as client:
                    client.chat.completions.create(model=MODEL, messages=HI)
            else:
                async with stormguard.AsyncOpenAI(
                    base_url=hostile.base_url, api_key="sk-test-1"
                ) as aclient:  # a call's own timeout is its deadline too
                    await aclient.chat.completions.create(model=MODEL, messages=HI, timeout=0.5)
        elapsed = time.monotonic() - started
    assert isinstance(raised.value, stormguard.APITimeoutError)
    assert raised.value.retry_stopped_by == "deadline"
    assert 0.4 < elapsed < 3.0


def test_several_servers_the_first_one_down(server: RunningServer) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    with stormguard.OpenAI(base_url=[down, server.base_url], api_key="sk-test-1") as client:
        assert str(client.base_url) == down + "/"  # openai builds its URLs on the first
        for _ in range(3):
            result = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
            assert result.choices[0].message.content


def test_your_http_client_is_the_pool(server: RunningServer) -> None:
    sent: list[str] = []
    pool = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    with stormguard.OpenAI(base_url=server.base_url, api_key="sk-test-1", http_client=pool) as c:
        c.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
    assert sent == ["/v1/chat/completions"]
    assert not pool.is_closed  # yours, as stormguard.Client leaves it
    pool.close()


def test_no_error_shows_the_key_a_server_echoes() -> None:
    async def echo(request: object, writer: asyncio.StreamWriter) -> None:
        headers = getattr(request, "headers", {})
        key = headers.get("authorization", "").removeprefix("Bearer ")
        await answer(401, {"error": {"message": f"bad key {key}", "code": key}})(
            request,  # type: ignore[arg-type]
            writer,
        )

    with (
        HostileServer({"/v1/chat/completions": echo}) as hostile,
        stormguard.OpenAI(base_url=hostile.base_url, api_key=KEY) as client,
        pytest.raises(openai.AuthenticationError) as raised,
    ):
        client.chat.completions.create(model=MODEL, messages=HI)
    error = raised.value
    assert not leaks(str(error)) and not leaks(repr(error)) and not leaks(str(error.code))


def test_a_stormguard_http_client_is_shared_and_carries_its_options(
    server: RunningServer,
) -> None:
    http = stormguard.httpx_client(base_url=server.base_url, max_retries=4)
    with stormguard.OpenAI(base_url=server.base_url, api_key="k", http_client=http) as client:
        assert client.stormguard is http._transport.client  # type: ignore[attr-defined]
        assert client.max_retries == 4
        bounded = client.with_options(timeout=openai.Timeout(20, connect=1.5))
        assert bounded.stormguard is not client.stormguard  # its attempts' bounds changed
        assert bounded.stormguard.retry_budget is client.stormguard.retry_budget
        assert bounded.chat.completions.create(model=MODEL, messages=HI, max_tokens=4).choices
    with pytest.raises(TypeError, match="carries its options"):
        stormguard.OpenAI(base_url=server.base_url, api_key="k", http_client=http, priority="x")
    with pytest.raises(TypeError, match="AsyncClient"):
        stormguard.OpenAI(
            api_key="k", http_client=stormguard.async_httpx_client(base_url=server.base_url)
        )


def test_import_stormguard_as_openai_catches_what_its_client_raises() -> None:
    """A module that says ``import stormguard as openai`` builds ``openai.OpenAI(...)``
    and catches ``openai.OpenAIError`` and ``openai.InternalServerError``: each catches
    what that client raises."""
    import stormguard as openai_here

    caught: list[Exception] = []
    with (
        HostileServer({"/v1/chat/completions": answer(500, ERROR_500)}) as hostile,
        openai_here.OpenAI(base_url=hostile.base_url, api_key="sk-test-1") as client,
    ):
        try:
            client.chat.completions.create(model=MODEL, messages=HI)
        except openai_here.InternalServerError as error:
            caught.append(error)
    down = f"http://127.0.0.1:{free_port()}/v1"
    with openai_here.OpenAI(base_url=down, api_key="sk-test-1") as client:
        try:
            client.models.list()
        except openai_here.OpenAIError as error:
            caught.append(error)
    status_error, connection_error = caught
    assert isinstance(status_error, openai.InternalServerError)
    assert isinstance(connection_error, openai_here.APIConnectionError)


def test_a_client_of_deployments_needs_no_key_of_its_own(server: RunningServer) -> None:
    # openai's client refuses to be made without a key; each deployment sends its own.
    deployment = stormguard.Deployment(
        server.base_url, name="primary", api_key="sk-deployment-key-1234", models={"chat": MODEL}
    )
    with stormguard.OpenAI(base_url=[deployment]) as client:
        result = client.chat.completions.create(model="chat", messages=HI, max_tokens=4)
    assert isinstance(result, ChatCompletion) and result.choices[0].message.content
    info = stormguard.call_info(result)
    assert info is not None and info.deployment == "primary"
