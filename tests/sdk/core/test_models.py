"""OpenAI-shaped records: attribute access, unknown fields kept, to_dict."""

from __future__ import annotations

import pytest

from stormguard import ChatCompletion, ChatCompletionChunk, ModelList
from tests.sdk.helpers import chat_json


def test_attribute_access_nested_and_typed() -> None:
    resp = ChatCompletion(chat_json("hi"))
    assert resp.choices[0].message.content == "hi"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.prompt_tokens == 5
    assert resp["id"] == "chatcmpl-1"


def test_declared_missing_fields_read_as_none_and_unknown_raise() -> None:
    resp = ChatCompletion({"id": "x", "choices": []})
    assert resp.usage is None
    assert resp.system_fingerprint is None
    with pytest.raises(AttributeError, match="no field 'nonexistent'"):
        _ = resp.nonexistent


def test_unknown_fields_are_kept_and_readable() -> None:
    data = chat_json(prompt_logprobs=None, kv_transfer_params={"a": [1, {"b": 2}]})
    resp = ChatCompletion(data)
    assert resp.kv_transfer_params.a[1].b == 2
    assert resp.to_dict() == data
    copy = resp.to_dict()
    copy["id"] = "changed"
    assert resp.id == "chatcmpl-1"  # to_dict is a deep copy


def test_chunk_delta_and_model_list_iteration() -> None:
    chunk = ChatCompletionChunk({"choices": [{"index": 0, "delta": {"content": "x"}}]})
    assert chunk.choices[0].delta.content == "x"
    assert chunk.choices[0].delta.role is None
    models = ModelList({"object": "list", "data": [{"id": "a", "max_model_len": 4096}]})
    assert [m.id for m in models] == ["a"]
    assert models.data[0].max_model_len == 4096
    assert len(models) == 1


def test_hand_built_result_has_empty_call_info() -> None:
    resp = ChatCompletion(chat_json())
    assert resp.attempts == 0
    assert resp.server_load.is_empty
    assert resp.request_id is None
