"""A 2xx body whose fields the records cannot serve fails the call, typed.

``"choices": {"0": 1}``, ``null`` choices, ``Infinity`` or ``"3"`` token counts
once reached the caller as a result, to fail later with a ``KeyError`` or
``AttributeError`` at attribute access. Now the call (or the streamed chunk)
raises ``APIResponseValidationError`` naming the field, and a result that comes
back serves every documented attribute. A field that is merely absent reads
as None.
"""

from __future__ import annotations

import copy
import json
import math
import types
import typing
from typing import Any

import httpx
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stormguard
from stormguard._core import results as _results
from stormguard._core.record_shapes import ChunkCheck, fits, shape_of, shape_problem
from tests.sdk.helpers import BASE, MESSAGES, Api, chat_json, chunk, event_stream, sse

SECRET = "sk-test-secret-key"

BAD_CHAT = {
    "choices an object": ({"choices": {"0": 1}}, "choices must be a list, got an object"),
    "choices null": ({"choices": None}, "choices must be a list, got null"),
    "a choice a number": ({"choices": [1]}, "choices[0] must be an object, got a number"),
    "a message a string": (
        {"choices": [{"index": 0, "message": "hi"}]},
        "choices[0].message must be an object, got a string",
    ),
    "content a number": (
        {"choices": [{"index": 0, "message": {"content": 5}}]},
        "choices[0].message.content must be a string, got a number",
    ),
    "tokens Infinity": (
        {"usage": {"total_tokens": math.inf}},
        "usage.total_tokens must be an integer, got Infinity or NaN",
    ),
    "tokens a string": (
        {"usage": {"prompt_tokens": "3"}},
        "usage.prompt_tokens must be an integer, got a string",
    ),
    "tokens a fraction": (
        {"usage": {"completion_tokens": 2.5}},
        "usage.completion_tokens must be an integer, got a number",
    ),
    "created a boolean": ({"created": True}, "created must be an integer, got a boolean"),
    "a tool call's function a list": (
        {"choices": [{"message": {"tool_calls": [{"id": "t", "function": []}]}}]},
        "choices[0].message.tool_calls[0].function must be an object, got a list",
    ),
}


def body_with(**fields: Any) -> bytes:
    body = chat_json()
    body.update(fields)
    return json.dumps(body).encode()  # Infinity as Python writes it, and reads it back


@pytest.mark.parametrize(("fields", "message"), BAD_CHAT.values(), ids=BAD_CHAT.keys())
async def test_a_body_the_records_cannot_serve_fails_the_call(
    api: Api, mock: respx.MockRouter, fields: dict[str, Any], message: str
) -> None:
    route = mock.post("/chat/completions").respond(
        200, content=body_with(**fields), headers={"content-type": "application/json"}
    )
    with pytest.raises(stormguard.APIResponseValidationError) as info:
        await api.run(api.client().chat.completions.create(messages=MESSAGES))
    error = info.value
    assert str(error) == f"The response does not fit ChatCompletion: {message}"
    assert error.status_code == 200 and error.response is not None
    assert error.attempts == 1 and route.call_count == 1  # a broken answer is not retried
    assert SECRET not in repr(error) and SECRET[-8:] not in str(error)


async def test_absent_fields_and_null_scalars_read_as_none(
    api: Api, mock: respx.MockRouter
) -> None:
    body = {"choices": [{"message": {"content": None, "role": None}}], "id": None, "usage": None}
    mock.post("/chat/completions").respond(200, json=body)
    result = await api.run(api.client().chat.completions.create(messages=MESSAGES))
    assert result.id is None and result.created is None and result.usage is None
    assert result.choices[0].message.content is None and result.choices[0].index is None
    mock.post("/chat/completions").respond(200, json={"object": "chat.completion"})
    result = await api.run(api.client().chat.completions.create(messages=MESSAGES))
    assert result.choices is None  # absent: as before, None


async def test_with_raw_response_parse_fails_the_same_way(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(200, content=body_with(choices={"0": 1}))
    create = api.client().chat.completions.with_raw_response.create
    with pytest.raises(stormguard.APIResponseValidationError, match="choices must be a list"):
        await api.run(create(messages=MESSAGES))


async def test_an_embedding_may_be_floats_or_base64_text(api: Api, mock: respx.MockRouter) -> None:
    data = [{"index": 0, "embedding": [0.5, 1]}, {"index": 1, "embedding": "AAAAPw=="}]
    mock.post("/embeddings").respond(200, json={"data": data, "model": "m"})
    result = await api.run(api.client().embeddings.create(input="a", encoding_format="float"))
    assert [d.embedding for d in result.data] == [[0.5, 1], "AAAAPw=="]
    mock.post("/embeddings").respond(200, json={"data": [{"embedding": {"x": 1}}]})
    with pytest.raises(stormguard.APIResponseValidationError, match="a list or a string"):
        await api.run(api.client().embeddings.create(input="a", encoding_format="float"))


async def test_a_streamed_chunk_that_does_not_fit_is_a_validation_error(
    api: Api, mock: respx.MockRouter
) -> None:
    bad = chunk("b", choices=[{"index": 0, "delta": "b"}])
    mock.post("/chat/completions").mock(return_value=event_stream(sse(chunk("a"), bad)))
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    got: list[Any] = []
    with pytest.raises(stormguard.APIResponseValidationError) as info:
        await api.collect_into(stream, got)
    assert [c.choices[0].delta.content for c in got] == ["a"]  # what fit came first
    assert str(info.value) == (
        "A stream event does not fit ChatCompletionChunk:"
        " choices[0].delta must be an object, got a string"
    )
    assert stream.response.is_closed


async def test_a_first_chunk_that_does_not_fit_fails_the_call(
    api: Api, mock: respx.MockRouter
) -> None:
    bad = chunk("a", usage={"total_tokens": "7"})
    route = mock.post("/chat/completions").mock(return_value=event_stream(sse(bad)))
    create = api.client().chat.completions.create
    with pytest.raises(stormguard.APIResponseValidationError, match=r"usage\.total_tokens"):
        await api.run(create(messages=MESSAGES, stream=True))
    assert route.call_count == 1


async def test_a_responses_api_event_that_does_not_fit_is_a_validation_error(
    api: Api, mock: respx.MockRouter
) -> None:
    from tests.sdk.client.test_endpoints_responses import events, sse_response, stream_of

    items = stream_of("a")
    items[-1] = {**items[-1], "response": {**items[-1]["response"], "output": {"x": 1}}}
    mock.post("/responses").mock(return_value=sse_response(events(*items)))
    stream = await api.run(api.client().responses.create(input="hi", stream=True))
    with pytest.raises(stormguard.APIResponseValidationError, match=r"response\.output must be"):
        await api.collect(stream)


def test_openai_on_the_transport_gets_the_chunks_as_they_came() -> None:
    """The transport's caller decodes the events itself: stormguard does not judge
    their fields (openai-python reads them its own way)."""
    openai = pytest.importorskip("openai")
    odd = chunk("a", usage={"total_tokens": "7"})

    def handler(request: httpx.Request) -> httpx.Response:
        return event_stream(sse(odd))

    http = stormguard.httpx_client(
        base_url=BASE, http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    oai = openai.OpenAI(base_url=BASE, api_key="k", http_client=http, max_retries=0)
    got = list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [c.choices[0].delta.content for c in got] == ["a"]


# -- every record type, against odd bodies ----------------------------------------------

RECORDS = [
    cls
    for cls in vars(_results).values()
    if isinstance(cls, type) and issubclass(cls, _results.Record) and cls is not _results.Record
]


def test_every_record_type_has_a_shape_the_check_knows() -> None:
    for cls in RECORDS:
        assert shape_problem(cls, {}) is None, cls  # an unknown field type would raise


def _serves(record: Any, cls: type) -> None:
    """Every declared field of ``record`` reads as None or as its declared type, and
    each nested record and list item in turn; numbers take arithmetic."""
    for name, hint in typing.get_type_hints(cls).items():
        if name.startswith("_"):
            continue
        value = getattr(record, name)
        if value is not None:
            _is(value, hint, (cls, name))


def _is(value: Any, hint: Any, where: tuple[type, str]) -> None:
    if where == (_results.Embedding, "embedding") and isinstance(value, str):
        return  # the base64 text, as documented
    options = [o for o in typing.get_args(hint) if o is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        assert len(options) == 1, hint
        hint = options[0]
    if hint is int:
        assert isinstance(value, int) and not isinstance(value, bool), (where, value)
        assert value + 1 > value
    elif hint is float:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (where, value)
        assert isinstance(value * 2.0, float)
    elif hint is str:
        assert isinstance(value, str), (where, value)
    elif typing.get_origin(hint) is list:
        assert isinstance(value, list), (where, value)
        (item,) = typing.get_args(hint)
        for entry in value:
            if isinstance(item, type) and issubclass(item, _results.Record):
                assert isinstance(entry, item), (where, entry)
                _serves(entry, item)
    else:
        assert isinstance(value, hint), (where, value)
        _serves(value, hint)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["0", "index", "content", "x"]), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at] if at else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*at, index))
    return found


def _mutated(body: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """``body`` with a few of its values (at any depth) replaced by odd JSON, or gone."""
    body = copy.deepcopy(body)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(body)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and data.draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JSON)
    return body


RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1.5,
    "status": "completed",
    "model": "m",
    "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
    "usage": {
        "input_tokens": 1,
        "output_tokens": 2,
        "total_tokens": 3,
        "input_tokens_details": {},
        "output_tokens_details": {},
    },
}
CALLS: dict[str, tuple[str, dict[str, Any], Any]] = {
    "chat": (
        "/chat/completions",
        chat_json(
            choices=[
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "hi",
                        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f"}}],
                    },
                    "finish_reason": "stop",
                    "logprobs": {"content": []},
                }
            ]
        ),
        lambda c: c.chat.completions.create(messages=MESSAGES),
    ),
    "completions": (
        "/completions",
        {"id": "c", "choices": [{"index": 0, "text": "x"}], "usage": {"total_tokens": 1}},
        lambda c: c.completions.create(prompt="p"),
    ),
    "embeddings": (
        "/embeddings",
        {"data": [{"index": 0, "embedding": [0.5]}], "usage": {"prompt_tokens": 1}},
        lambda c: c.embeddings.create(input="a", encoding_format="float"),
    ),
    "models": (
        "/models",
        {"object": "list", "data": [{"id": "m", "created": 1, "max_model_len": 8}]},
        lambda c: c.models.list(),
    ),
    "responses": ("/responses", RESPONSE, lambda c: c.responses.create(input="hi")),
}


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), which=st.sampled_from(sorted(CALLS)))
def test_an_odd_body_fails_the_call_typed_or_serves_every_field(
    data: st.DataObject, which: str
) -> None:
    path, valid, call = CALLS[which]
    body = _mutated(valid, data)
    with (
        respx.mock() as mock,
        stormguard.Client(base_url=BASE, model="m", api_key=SECRET, max_retries=0) as client,
    ):
        method = "GET" if which == "models" else "POST"
        mock.route(method=method, url=BASE + path).respond(
            200, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        try:
            result = call(client)
        except stormguard.APIResponseValidationError as error:
            assert str(error).startswith("The response does not fit")
            assert SECRET[-8:] not in str(error)
            return
    _serves(result, type(result))
    result.to_dict()
    if isinstance(result, stormguard.ModelList):
        assert len(list(result)) == len(result)
    if isinstance(result, stormguard.Response):
        assert isinstance(result.output_text, str)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_an_odd_streamed_chunk_is_a_typed_error_or_serves_every_field(
    data: st.DataObject,
) -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    valid = json.loads(chunk("a", usage=usage))
    valid["choices"][0]["delta"]["tool_calls"] = [{"id": "t", "function": {"arguments": "{}"}}]
    odd = _mutated(valid, data)
    with (
        respx.mock() as mock,
        stormguard.Client(base_url=BASE, model="m", api_key=SECRET, max_retries=0) as client,
    ):
        mock.post(BASE + "/chat/completions").mock(
            return_value=event_stream(sse(chunk("first"), json.dumps(odd)))
        )
        stream = client.chat.completions.create(messages=MESSAGES, stream=True)
        got = []
        try:
            for item in stream:
                got.append(item)
        except stormguard.APIResponseValidationError as error:
            assert str(error).startswith("A stream event does not fit ChatCompletionChunk")
            assert len(got) == 1
            return
        except stormguard.APIStatusError:
            assert "error" in odd  # an error event: a status error, as before
            return
    assert len(got) == 2
    for item in got:
        _serves(item, stormguard.ChatCompletionChunk)


def test_output_text_skips_a_message_whose_content_is_not_a_list() -> None:
    output = [
        {"type": "message", "content": True},
        {"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
    ]
    assert stormguard.Response({"output": output}).output_text == "hi"


def _chunk_text(content: Any, **extra: Any) -> str:
    body = json.loads(chunk("x", **extra))
    body["choices"][0]["delta"]["content"] = content
    return json.dumps(body, separators=(",", ":"))


def _learned_check() -> ChunkCheck:
    """A stream's check after a role chunk and two content chunks: it knows the one
    string its chunks differ in."""
    check = ChunkCheck(shape_of(stormguard.ChatCompletionChunk))
    first = json.loads(_chunk_text(""))
    first["choices"][0]["delta"]["role"] = "assistant"
    for text in (json.dumps(first), _chunk_text("a"), _chunk_text("b")):
        assert check.fits(text, json.loads(text))
    return check


# What a server could put where the token goes: quotes, escapes, a cut escape,
# a value of another type, another field.
_MIDDLES = st.lists(
    st.sampled_from(
        [
            *["a", " ", '"', "\\", '\\"', "\\\\", "\\n", "\\u00e9", "\\u00", "1", ",", ":"],
            *["{", "}", '"x":"', '", "content": 5, "y":"', '"},"finish_reason":7,"x":{"a":"'],
            '":null,"z":"',
        ]
    ),
    max_size=6,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(_MIDDLES)
def test_a_chunk_that_differs_in_the_remembered_string_only_fits_as_the_fields_say(
    middle: str,
) -> None:
    """The check skips the fields of a chunk that is the remembered text around the
    token's string with anything in between; whatever the between, its answer is the
    field-by-field one, for every text that decodes."""
    check = _learned_check()
    head, tail = check._head, check._tail
    assert head is not None and head.endswith('"content":"') and tail.startswith('"}')
    text = head + middle + tail
    try:
        data = json.loads(text)
    except ValueError:
        return  # not JSON: the stream refuses it before any check
    assert check.fits(text, data) == fits(check.shape, data)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.data(), min_size=1, max_size=8))
def test_the_check_of_a_stream_of_odd_chunks_agrees_with_the_field_by_field_one(
    draws: list[st.DataObject],
) -> None:
    """Chunks of a stream, some the same but for their token, some with a field of
    another type, added or gone: each answer is the field-by-field one."""
    check = _learned_check()
    valid = json.loads(_chunk_text("t"))
    for data in draws:
        body = _mutated(valid, data) if data.draw(st.booleans()) else copy.deepcopy(valid)
        if data.draw(st.booleans()):
            body["choices"] = [{"index": 0, "delta": {"content": data.draw(st.text())}}]
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=data.draw(st.booleans()))
        assert check.fits(text, json.loads(text)) == fits(check.shape, json.loads(text))


def test_a_stream_whose_chunks_differ_in_more_than_one_string_stops_looking() -> None:
    """Chunks that differ in two strings (OpenAI adds an ``obfuscation`` one) are
    checked field by field; the stream looks for one changing string a few times,
    then keeps nothing."""
    check = ChunkCheck(shape_of(stormguard.ChatCompletionChunk))
    for index in range(20):
        text = _chunk_text(f"t{index}", obfuscation=f"o{index}")
        assert check.fits(text, json.loads(text))
    assert check._head is None and check._last is None
    bad = _chunk_text("t", obfuscation=5)
    assert not check.fits(bad, json.loads(bad))


async def test_a_bad_chunk_amid_a_piece_of_many_is_named_after_those_before_it(
    api: Api, mock: respx.MockRouter
) -> None:
    """Chunks that arrive many in one piece (a buffering proxy) take the decoder's and
    the check's short ways; the one that does not fit is still named where it is."""
    good = [chunk(f"t{i}") for i in range(300)]
    bad = chunk("t", choices=[{"index": "0", "delta": {"content": "t"}}])
    body = sse(*good, bad, *good)
    mock.post("/chat/completions").mock(return_value=event_stream(body))
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    got: list[Any] = []
    with pytest.raises(stormguard.APIResponseValidationError) as info:
        await api.collect_into(stream, got)
    assert [c.choices[0].delta.content for c in got] == [f"t{i}" for i in range(300)]
    assert str(info.value) == (
        "A stream event does not fit ChatCompletionChunk:"
        " choices[0].index must be an integer, got a string"
    )


def test_chunks_that_differ_in_a_key_are_each_checked_field_by_field() -> None:
    """Two chunks that differ in one key only (``"x1"`` and ``"x2"``, undeclared) teach
    the check nothing: a key is not a value, and another key may take another type."""
    check = ChunkCheck(shape_of(stormguard.ChatCompletionChunk))
    for key in ("x1", "x2", "x3"):
        text = json.dumps({"choices": [{"index": 0, "delta": {key: 5}}]})
        assert check.fits(text, json.loads(text))
    bad = json.dumps({"choices": [{"index": 0, "delta": {"content": 5}}]})
    assert not check.fits(bad, json.loads(bad))
