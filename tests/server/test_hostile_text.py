"""Any text in any string field gets an answer, never a 500.

JSON can carry a lone surrogate as an escape (``"\\ud800"``); Python keeps it, and
UTF-8 cannot encode it, so an error that echoes it (an unknown model) used to
fail to render. Each hostile string goes into each field as raw JSON text."""

from __future__ import annotations

import json

import httpx
import pytest

HOSTILE = {
    "lone high surrogate": "\\ud800",
    "lone low surrogate": "\\udfff",
    "reversed pair": "\\udc00\\ud800",
    "nul": "a\\u0000b",
    "byte order mark": "\\ufeffx",
    "noncharacter": "\\uffff",
    "right-to-left override": "\\u202eabc",
    "emoji": "\\ud83d\\ude00",
}
# (route, body with {} where the hostile string goes, as JSON source)
FIELDS = {
    "chat model": (
        "/v1/chat/completions",
        '{"model": "{}", "messages": [{"role": "user", "content": "hi"}]}',
    ),
    "chat content": (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "{}"}], "max_tokens": 2}',
    ),
    "chat stream": (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "{}"}], "max_tokens": 2, "stream": true}',
    ),
    "chat role": (
        "/v1/chat/completions",
        '{"messages": [{"role": "{}", "content": "hi"}], "max_tokens": 2}',
    ),
    "chat stop": (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stop": ["{}"]}',
    ),
    "completion prompt": ("/v1/completions", '{"prompt": "{}", "max_tokens": 2}'),
    "tokenize model": ("/tokenize", '{"model": "{}", "prompt": "x"}'),
    "tokenize prompt": ("/tokenize", '{"prompt": "{}"}'),
}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("text", HOSTILE)
async def test_hostile_text_in_any_field_is_answered_without_a_500(
    client: httpx.AsyncClient, field: str, text: str
) -> None:
    route, template = FIELDS[field]
    body = template.replace("{}", HOSTILE[text], 1)
    response = await client.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text
    if response.headers["content-type"].startswith("application/json"):
        json.loads(response.content)  # a body any JSON reader decodes


async def test_an_unknown_model_with_a_lone_surrogate_is_echoed_escaped(
    client: httpx.AsyncClient,
) -> None:
    body = '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'
    response = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 404
    assert b"\\ud800" in response.content  # escaped: the bytes are ASCII, the text the same
    assert response.json()["error"]["message"] == "The model `\ud800` does not exist."
