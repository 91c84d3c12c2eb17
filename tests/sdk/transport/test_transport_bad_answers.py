"""A 2xx answer that breaks the API, under openai-python on stormguard's transport.

A stream answered with a JSON (or HTML) 200, a first event that is not JSON, a
stream past ``max_response_bytes`` before its first chunk: stormguard fails the
call with ``APIResponseValidationError``. openai-python on its own reads such an
answer as an empty stream, without a word; it once got an ``httpx.DecodingError``
from the transport, which it reports as ``APIConnectionError: Connection
error.``. The transport now answers as a gateway does for an upstream's invalid
answer: a 502 whose error body keeps the reason, so openai raises its
``InternalServerError`` saying what was wrong, and does not retry it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import respx

from tests.sdk.helpers import BASE, chat_json, chunk, event_stream, sse
from tests.sdk.transport.test_transport import Oai, mode  # noqa: F401  (the fixture)


@pytest.fixture
def mock() -> Any:
    with respx.mock(assert_all_called=False) as router:
        yield router


BAD = {
    "json for a stream": (
        httpx.Response(200, json=chat_json()),
        "Expected an event stream, got content-type 'application/json'",
    ),
    "html for a stream": (
        httpx.Response(200, text="<html>proxy login</html>", headers={"content-type": "text/html"}),
        "Expected an event stream, got content-type 'text/html'",
    ),
    "a first event that is not json": (
        event_stream(sse("<html>", done=False)),
        "A stream event is not a JSON object: '<html>'",
    ),
}


@pytest.mark.parametrize(("answer", "reason"), BAD.values(), ids=BAD.keys())
async def test_a_broken_stream_answer_is_a_502_that_keeps_the_reason(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,
    answer: httpx.Response,
    reason: str,
) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(return_value=answer)
    oai = Oai(mode)
    with pytest.raises(openai.InternalServerError) as info:
        await oai.chat(stream=True)
    error = info.value
    assert error.status_code == 502
    assert reason in error.message
    assert error.code == "invalid_response"
    assert error.response.headers["x-should-retry"] == "false"  # openai does not retry
    assert error.response.extensions["stormguard"].stop_reason == "not_retryable"
    assert route.call_count == 1


async def test_a_stream_past_the_size_cap_before_its_first_chunk_is_a_502(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,
) -> None:
    mock.post(f"{BASE}/chat/completions").mock(
        return_value=event_stream(b": " + b"x" * 4096 + b"\n\n" + sse(chunk("a")))
    )
    oai = Oai(mode, max_response_bytes=1024)
    with pytest.raises(openai.InternalServerError, match="max_response_bytes=1024"):
        await oai.chat(stream=True)


async def test_a_key_echoed_in_the_content_type_is_not_in_the_502(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,
) -> None:
    key = "sk-echoed-secret-0123456789abcdef"
    mock.post(f"{BASE}/chat/completions").respond(
        200, content=b"{}", headers={"content-type": f"application/json; key={key}"}
    )
    oai = Oai(mode, api_key=key)
    with pytest.raises(openai.InternalServerError) as info:
        await oai.chat(stream=True)
    assert key[-8:] not in json.dumps(info.value.body) and key[-8:] not in str(info.value)


async def test_a_plain_answer_is_handed_on_as_the_server_sent_it(
    mode: str,  # noqa: F811
    mock: respx.MockRouter,
) -> None:
    """Only a stream is judged here: a non-stream body is openai-python's to decode."""
    mock.post(f"{BASE}/chat/completions").respond(200, json={"choices": {"0": 1}})
    oai = Oai(mode)
    result = await oai.chat()
    assert result.choices == {"0": 1}  # openai-python builds its model without a check
