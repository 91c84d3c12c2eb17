"""instructor over stormguard, both ways: ``instructor.from_openai(openai.OpenAI(
http_client=stormguard.httpx_client(...)))``, or ``instructor.from_openai(
stormguard.OpenAI(...))`` (its ``isinstance`` check takes it). Its ``max_retries``
re-asks the model when the answer fails validation; an API error it hands on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import instructor
import openai
import pytest
from instructor.core.exceptions import InstructorRetryException

import stormguard
from tests.e2e.server_process import RunningServer
from tests.frameworks.scenarios import (
    KEY,
    MODEL,
    WAYS,
    Person,
    alone,
    failing,
    reference_server,
    tracked,
)

ASK = [{"role": "user", "content": "a person"}]


def openai_client(base_url: str, way: str, *, asynchronous: bool = False) -> Any:
    """The openai client instructor patches, at openai's default retries."""
    if way == "http_client":
        if asynchronous:
            http = tracked(stormguard.async_httpx_client(base_url=base_url))
            return openai.AsyncOpenAI(base_url=base_url, api_key=KEY, http_client=http)
        sync_http = tracked(stormguard.httpx_client(base_url=base_url))
        return openai.OpenAI(base_url=base_url, api_key=KEY, http_client=sync_http)
    if asynchronous:
        return tracked(stormguard.AsyncOpenAI(base_url=base_url, api_key=KEY))
    return tracked(stormguard.OpenAI(base_url=base_url, api_key=KEY))


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with reference_server() as running:
        yield running


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


def test_a_plain_call(server: RunningServer, way: str) -> None:
    client = instructor.from_openai(openai_client(server.base_url, way))
    completion = client.chat.completions.create(
        model=MODEL, response_model=None, messages=ASK, max_tokens=8
    )
    assert isinstance(completion, openai.types.chat.ChatCompletion)
    assert completion.choices[0].message.content


def test_a_tool_call_read_as_a_model(server: RunningServer, way: str) -> None:
    client = instructor.from_openai(openai_client(server.base_url, way), mode=instructor.Mode.TOOLS)
    person, completion = client.chat.completions.create_with_completion(
        model=MODEL, response_model=Person, messages=ASK
    )
    assert isinstance(person, Person)
    assert completion.choices[0].message.tool_calls


def test_structured_output_by_json_schema(server: RunningServer, way: str) -> None:
    client = instructor.from_openai(
        openai_client(server.base_url, way), mode=instructor.Mode.JSON_SCHEMA
    )
    person = client.chat.completions.create(model=MODEL, response_model=Person, messages=ASK)
    assert isinstance(person, Person)


def test_a_stream_of_partial_models(server: RunningServer, way: str) -> None:
    client = instructor.from_openai(openai_client(server.base_url, way))
    partials = list(
        client.chat.completions.create_partial(model=MODEL, response_model=Person, messages=ASK)
    )
    assert len(partials) > 2
    assert partials[-1].name and isinstance(partials[-1].age, int)


async def test_an_async_call(server: RunningServer, way: str) -> None:
    client = instructor.from_openai(openai_client(server.base_url, way, asynchronous=True))
    person = await client.chat.completions.create(model=MODEL, response_model=Person, messages=ASK)
    assert isinstance(person, Person)


def test_a_500(way: str) -> None:
    with failing("500") as target, pytest.raises(InstructorRetryException) as raised:
        client = instructor.from_openai(openai_client(target.base_url, way))
        client.chat.completions.create(model=MODEL, response_model=Person, messages=ASK)
    cause = raised.value.__cause__
    assert isinstance(cause, openai.InternalServerError) and cause.status_code == 500
    if way == "stormguard_client":
        assert isinstance(cause, stormguard.InternalServerError)
    assert target.requests == alone("500")


def test_a_shed_with_retry_after(way: str) -> None:
    with failing("shed") as target, pytest.raises(InstructorRetryException) as raised:
        client = instructor.from_openai(openai_client(target.base_url, way))
        client.chat.completions.create(model=MODEL, response_model=Person, messages=ASK)
    assert isinstance(raised.value.__cause__, openai.InternalServerError)
    assert target.requests == alone("shed")


def test_a_refused_connection(way: str) -> None:
    with failing("refused") as target, pytest.raises(InstructorRetryException) as raised:
        client = instructor.from_openai(openai_client(target.base_url, way))
        client.chat.completions.create(model=MODEL, response_model=Person, messages=ASK)
    assert isinstance(raised.value.__cause__, openai.APIConnectionError)
    assert target.requests == alone("refused")  # the connections tried


def test_a_crash_after_the_first_chunk(way: str) -> None:
    with failing("crash") as target, pytest.raises(InstructorRetryException) as raised:
        client = instructor.from_openai(
            openai_client(target.base_url, way), mode=instructor.Mode.JSON
        )
        for _ in client.chat.completions.create_partial(
            model=MODEL, response_model=Person, messages=ASK
        ):
            pass
    cause = raised.value.__cause__  # an error, not the partial model taken for the whole
    assert isinstance(cause, openai.APIConnectionError)
    assert isinstance(cause, stormguard.StreamInterruptedError)
    assert target.requests == alone("crash") == 1
