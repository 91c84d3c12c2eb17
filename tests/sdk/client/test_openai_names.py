"""openai-python's names on stormguard: the client classes, ``_request_id`` and ``to_json``,
so that code written for openai ports by changing only its import."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import respx

import stormguard
from stormguard.openai_errors import openai_class
from tests.sdk.helpers import BASE, Api, chat_json, sse


def test_openai_class_names_are_openais_clients_over_stormguard() -> None:
    assert issubclass(stormguard.OpenAI, openai.OpenAI)
    assert issubclass(stormguard.AsyncOpenAI, openai.AsyncOpenAI)


def test_openai_error_is_the_base_of_what_openais_client_raises() -> None:
    """``import stormguard as openai``: ``except openai.OpenAIError`` catches what
    ``openai.OpenAI(...)`` raises there, stormguard's errors and openai's own
    (``LengthFinishReasonError`` of ``.parse()``) alike."""
    assert stormguard.OpenAIError is openai.OpenAIError
    for cls in (stormguard.RateLimitError, stormguard.APIConnectionError):
        assert issubclass(openai_class(cls), stormguard.OpenAIError)
    assert issubclass(openai.LengthFinishReasonError, stormguard.OpenAIError)
    assert "OpenAIError" in stormguard.__all__


def test_without_openai_the_names_are_stormguards_clients() -> None:
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "import stormguard\n"
        "assert stormguard.OpenAI is stormguard.Client, stormguard.OpenAI\n"
        "assert stormguard.AsyncOpenAI is stormguard.AsyncClient\n"
        "assert stormguard.OpenAIError is stormguard.StormguardError\n"
        "assert 'openai' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr


async def test_request_id_under_openais_underscore_name(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        return_value=httpx.Response(200, json=chat_json("hi"), headers={"x-request-id": "req-42"})
    )
    client = api.client()
    result = await api.run(
        client.chat.completions.create(messages=[{"role": "user", "content": "x"}])
    )
    assert result._request_id == result.request_id == "req-42"


def test_a_hand_built_result_has_no_request_id() -> None:
    assert stormguard.ChatCompletion({"id": "c"})._request_id is None


def test_to_json_is_the_json_object_as_text() -> None:
    record = stormguard.ChatCompletion({"id": "c", "choices": [], "vendor_field": 1})
    assert json.loads(record.to_json()) == record.to_dict()
    assert record.to_json().startswith('{\n  "id"')  # indent=2, as openai's
    assert record.to_json(indent=None) == '{"id": "c", "choices": [], "vendor_field": 1}'


async def test_an_async_stream_closes_with_openais_close(mock: respx.MockRouter) -> None:
    chunk = json.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}]})
    mock.post("/chat/completions").mock(
        return_value=httpx.Response(
            200, content=sse(chunk, chunk), headers={"content-type": "text/event-stream"}
        )
    )
    async with stormguard.AsyncClient(base_url=BASE, model="m") as client:
        stream = await client.chat.completions.create(messages=[], stream=True)
        assert (await stream.__anext__()).choices[0].delta.content == "x"
        await stream.close()  # openai's AsyncStream is closed so (aclose() as well)
        assert stream.response.is_closed
