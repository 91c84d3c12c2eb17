"""openai-python's names on stormguard: the client classes, ``_request_id`` and ``to_json``,
so that code written for openai ports by changing only its import."""

from __future__ import annotations

import json

import httpx
import respx

import stormguard
from tests.sdk.helpers import Api, chat_json


def test_openai_class_names_are_the_clients() -> None:
    assert stormguard.OpenAI is stormguard.Client
    assert stormguard.AsyncOpenAI is stormguard.AsyncClient


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
