"""stormguard's records against openai-python's models: every field openai declares
reads (None when the server left it out), and ``model_dump()``/``model_dump_json()``
exist, so code written against openai's types (a framework's, a user's) does not
fail on a ``stormguard.Client`` result with ``AttributeError``."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from openai import types as oai
from openai.types import chat as oai_chat
from openai.types import completion_usage, create_embedding_response
from openai.types.chat import chat_completion, chat_completion_chunk
from openai.types.responses import ResponseStreamEvent as OpenAIResponseStreamEvent
from openai.types.responses import response_usage
from pydantic import BaseModel

from stormguard._core import results as sg
from tests.sdk.helpers import chat_json

#: Each stormguard record and the openai model(s) whose fields it must declare.
PAIRS: list[tuple[type[sg.Record], type[BaseModel]]] = [
    (sg.ChatCompletion, oai_chat.ChatCompletion),
    (sg.Choice, chat_completion.Choice),
    (sg.ChatCompletionMessage, oai_chat.ChatCompletionMessage),
    (sg.ToolCall, oai_chat.ChatCompletionMessageFunctionToolCall),
    (sg.ToolCall, chat_completion_chunk.ChoiceDeltaToolCall),
    (sg.FunctionCall, oai_chat.chat_completion_message_function_tool_call.Function),
    (sg.FunctionCall, chat_completion_chunk.ChoiceDeltaToolCallFunction),
    (sg.ChatCompletionChunk, oai_chat.ChatCompletionChunk),
    (sg.ChunkChoice, chat_completion_chunk.Choice),
    (sg.ChoiceDelta, chat_completion_chunk.ChoiceDelta),
    (sg.Completion, oai.Completion),
    (sg.CompletionChoice, oai.CompletionChoice),
    (sg.CompletionUsage, completion_usage.CompletionUsage),
    (sg.CreateEmbeddingResponse, oai.CreateEmbeddingResponse),
    (sg.EmbeddingUsage, create_embedding_response.Usage),
    (sg.Embedding, oai.Embedding),
    (sg.Model, oai.Model),
    (sg.Response, oai.responses.Response),
    (sg.ResponseUsage, response_usage.ResponseUsage),
]


def _event_models() -> list[type[BaseModel]]:
    """Every event class of openai's ``ResponseStreamEvent`` union."""
    union: Any = OpenAIResponseStreamEvent
    if typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    return [m for m in typing.get_args(union) if isinstance(m, type)]


PAIRS += [(sg.ResponseStreamEvent, model) for model in _event_models()]


@pytest.mark.parametrize(
    ("record", "model"), PAIRS, ids=lambda t: t.__name__ if isinstance(t, type) else str(t)
)
def test_every_field_openai_declares_reads_as_none_when_absent(
    record: type[sg.Record], model: type[BaseModel]
) -> None:
    missing = set(model.model_fields) - record._optional
    assert not missing, f"{record.__name__} lacks openai's {sorted(missing)}"
    empty = record({})
    for name in model.model_fields:
        assert getattr(empty, name) is None


def test_a_misspelt_field_still_raises() -> None:
    with pytest.raises(AttributeError, match="no field 'choises'"):
        _ = sg.ChatCompletion({}).choises


def test_model_dump_has_every_declared_field_nested_ones_too() -> None:
    data = chat_json("hi", vendor_field={"kept": 1})
    dumped = sg.ChatCompletion(data).model_dump()
    assert dumped["service_tier"] is None and dumped["system_fingerprint"] is None
    assert dumped["vendor_field"] == {"kept": 1}
    message = dumped["choices"][0]["message"]
    assert message["content"] == "hi"
    assert message["audio"] is None and message["tool_calls"] is None
    assert dumped["usage"]["prompt_tokens_details"] is None
    # what openai's own model dumps, stormguard's does too
    theirs = oai_chat.ChatCompletion.model_validate(data).model_dump()
    assert set(theirs) <= set(dumped)
    assert set(theirs["choices"][0]["message"]) <= set(message)


def test_model_dump_options() -> None:
    data = chat_json("hi")
    record = sg.ChatCompletion(data)
    assert record.model_dump(exclude_unset=True) == record.to_dict() == data
    no_none = record.model_dump(exclude_none=True)
    assert "service_tier" not in no_none and "audio" not in no_none["choices"][0]["message"]
    assert set(record.model_dump(include={"id", "model"})) == {"id", "model"}
    assert "choices" not in record.model_dump(exclude={"choices"})
    text = record.model_dump_json()
    assert " " not in text.replace("hi", "")[:40]  # compact, as pydantic's
    assert json.loads(text) == record.model_dump()
    assert json.loads(record.model_dump_json(indent=2, exclude_unset=True)) == data


def test_model_dump_is_a_copy() -> None:
    record = sg.ChatCompletion(chat_json("hi"))
    dumped = record.model_dump()
    dumped["choices"][0]["message"]["content"] = "changed"
    assert record.choices[0].message.content == "hi"


def test_a_chunk_dumps_as_openais_does() -> None:
    data = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
    }
    ours = sg.ChatCompletionChunk(data).model_dump()
    theirs = oai_chat.ChatCompletionChunk.model_validate(data).model_dump()
    assert set(theirs) <= set(ours)
    assert set(theirs["choices"][0]["delta"]) <= set(ours["choices"][0]["delta"])
    assert ours["choices"][0]["delta"]["content"] == "x"


@pytest.mark.parametrize(
    ("record", "body", "problem"),
    [
        (sg.Response, {"parallel_tool_calls": 1}, "parallel_tool_calls must be true or false"),
        (sg.Response, {"instructions": 3}, "instructions must be a string or a list"),
        (sg.ChatCompletion, {"service_tier": 1}, "service_tier must be a string"),
    ],
)
def test_the_new_fields_are_checked_like_the_others(
    record: type[sg.Record], body: dict[str, Any], problem: str
) -> None:
    from stormguard._core.record_shapes import shape_problem

    assert (shape_problem(record, body) or "").startswith(problem)


@pytest.mark.parametrize(
    ("record", "body"),
    [
        (sg.Response, {"instructions": [{"type": "message"}], "tool_choice": {"type": "x"}}),
        (sg.Response, {"instructions": "be brief", "tool_choice": "auto", "background": None}),
        (sg.ResponseStreamEvent, {"delta": {"type": "logs"}}),
        (sg.ResponseStreamEvent, {"delta": "text"}),
    ],
)
def test_fields_of_several_shapes_take_each(record: type[sg.Record], body: dict[str, Any]) -> None:
    from stormguard._core.record_shapes import shape_problem

    assert shape_problem(record, body) is None
