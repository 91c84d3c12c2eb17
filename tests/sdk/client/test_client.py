"""The facade against respx: every endpoint, sync and async, and every bad input."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

import stormguard
from stormguard import RetryPolicy
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

NO_RETRY = RetryPolicy(max_attempts=1)


async def test_chat_completion_body_headers_and_result(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(
        200, json=chat_json("hi"), headers={"x-queue-depth": "2", "x-request-id": "req-1"}
    )
    client = api.client(priority="critical", default_headers={"X-Team": "search"})
    resp = await api.run(
        client.chat.completions.create(
            messages=MESSAGES,
            max_tokens=16,
            ignore_eos=True,
            extra_body={"min_tokens": 2},
            extra_headers={"x-trace": "t1"},
        )
    )
    assert resp.choices[0].message.content == "hi"
    assert resp.usage.total_tokens == 7
    assert resp.server_load.queue_depth == 2
    assert resp.request_id == "req-1"
    assert resp.attempts == 1
    sent = route.calls.last.request
    body = json.loads(sent.content)
    assert body == {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": 16,
        "ignore_eos": True,
        "min_tokens": 2,
    }
    assert sent.headers["authorization"] == "Bearer sk-test-secret-key"
    assert sent.headers["x-priority"] == "critical"
    assert sent.headers["x-team"] == "search"
    assert sent.headers["x-trace"] == "t1"
    assert sent.headers["x-stormguard-attempt"] == "1"
    assert 0 < int(sent.headers["x-request-deadline-ms"]) <= 120_000


async def test_completions_and_per_call_model(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/completions").respond(
        200,
        json={"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]},
    )
    client = api.client()
    resp = await api.run(client.completions.create(prompt="say ok", model="other", max_tokens=3))
    assert resp.choices[0].text == "ok"
    assert json.loads(route.calls.last.request.content)["model"] == "other"


async def test_models_list(api: Api, mock: respx.MockRouter) -> None:
    mock.get("/models").respond(
        200, json={"object": "list", "data": [{"id": "m", "max_model_len": 2048}]}
    )
    models = await api.run(api.client().models.list())
    assert [(m.id, m.max_model_len) for m in models] == [("m", 2048)]


async def test_missing_model_is_a_clear_error(api: Api) -> None:
    client = api.client(model=None)
    with pytest.raises(ValueError, match="No model"):
        await api.run(client.chat.completions.create(messages=MESSAGES))


async def test_bad_messages_type(api: Api) -> None:
    client = api.client()
    with pytest.raises(TypeError, match="messages"):
        await api.run(client.chat.completions.create(messages="hi"))  # type: ignore[arg-type]


async def test_stream_full_with_usage(api: Api, mock: respx.MockRouter) -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = sse(chunk("hel"), chunk("lo"), json.dumps({"choices": [], "usage": usage}))
    route = mock.post("/chat/completions").mock(
        return_value=event_stream(body, **{"x-queue-depth": "1"})
    )
    client = api.client()
    stream = await api.run(
        client.chat.completions.create(
            messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    chunks = await api.collect(stream)
    assert "".join(c.choices[0].delta.content for c in chunks[:2]) == "hello"
    assert chunks[-1].usage.total_tokens == 5
    assert stream.server_load.queue_depth == 1
    assert stream.attempts == 1
    assert stream.response.is_closed
    sent = json.loads(route.calls.last.request.content)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_completion_stream(api: Api, mock: respx.MockRouter) -> None:
    events = [json.dumps({"choices": [{"index": 0, "text": t}]}) for t in ("a", "b")]
    mock.post("/completions").mock(return_value=event_stream(sse(*events)))
    stream = await api.run(api.client().completions.create(prompt="p", stream=True))
    assert [c.choices[0].text for c in await api.collect(stream)] == ["a", "b"]


async def test_stream_closed_early_closes_response(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        return_value=event_stream(sse(*[chunk(str(i)) for i in range(50)]))
    )
    client = api.client()
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    if api.mode == "sync":
        with stream:
            first = next(iter(stream))
    else:
        async with stream:
            first = await stream.__anext__()
    assert first.choices[0].delta.content == "0"
    assert stream.response.is_closed
    assert stream.chunks_received == 1


@pytest.mark.parametrize(
    "body",
    [
        sse(chunk("a"), done=False),  # ends cleanly between events but without [DONE]
        sse(chunk("a"), done=False) + b'data: {"choices": [{"ind',  # cut mid-event
    ],
)
async def test_stream_cut_off_raises_stream_interrupted(
    api: Api, mock: respx.MockRouter, body: bytes
) -> None:
    mock.post("/chat/completions").mock(return_value=event_stream(body))
    client = api.client()
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    got = []
    with pytest.raises(stormguard.StreamInterruptedError, match="before \\[DONE\\]") as info:
        if api.mode == "sync":
            got.extend(stream)
        else:
            async for item in stream:
                got.append(item)
    assert len(got) == 1
    assert info.value.chunks_received == 1
    assert info.value.attempts == 1  # delivered content is never retried
    assert stream.response.is_closed


async def test_stream_garbage_event_is_a_validation_error(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(return_value=event_stream(sse(chunk("a"), "{not json")))
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APIResponseValidationError, match="not a JSON object"):
        await api.collect(stream)


async def test_stream_answered_with_json_is_a_validation_error(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(retry_policy=NO_RETRY)
    with pytest.raises(stormguard.APIResponseValidationError, match="event stream"):
        await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))


async def test_error_event_inside_200_stream_before_content_is_retried(
    api: Api, mock: respx.MockRouter
) -> None:
    shed = json.dumps({"error": {"message": "queue full", "type": "x", "code": 503}})
    mock.post("/chat/completions").mock(
        side_effect=[event_stream(sse(shed, done=False)), event_stream(sse(chunk("ok")))]
    )
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    assert [c.choices[0].delta.content for c in await api.collect(stream)] == ["ok"]
    assert [a.error_type for a in stream.attempt_history] == ["ServiceUnavailableError", None]


async def test_error_event_after_content_raises_its_class(api: Api, mock: respx.MockRouter) -> None:
    shed = json.dumps({"error": {"message": "engine died", "code": 500}})
    mock.post("/chat/completions").mock(return_value=event_stream(sse(chunk("a"), shed)))
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.InternalServerError, match="engine died"):
        await api.collect(stream)


async def test_an_error_event_whose_code_is_other_digits_is_a_500(
    api: Api, mock: respx.MockRouter
) -> None:
    """``"²"`` is a digit to ``str.isdigit``, no number to ``int()``: a code, not a status."""
    died = json.dumps({"error": {"message": "engine died", "code": "\u00b2"}})
    mock.post("/chat/completions").mock(return_value=event_stream(sse(chunk("a"), died)))
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.InternalServerError, match="engine died"):
        await api.collect(stream)


STATUS_CLASSES = [
    (400, stormguard.BadRequestError),
    (401, stormguard.AuthenticationError),
    (403, stormguard.PermissionDeniedError),
    (404, stormguard.NotFoundError),
    (409, stormguard.ConflictError),
    (422, stormguard.UnprocessableEntityError),
    (429, stormguard.RateLimitError),
    (500, stormguard.InternalServerError),
    (502, stormguard.InternalServerError),
    (503, stormguard.ServiceUnavailableError),
    (418, stormguard.APIStatusError),
]


@pytest.mark.parametrize(("status", "cls"), STATUS_CLASSES)
async def test_every_status_error_class(
    api: Api, mock: respx.MockRouter, status: int, cls: type[stormguard.APIStatusError]
) -> None:
    mock.post("/chat/completions").respond(
        status,
        json={"error": {"message": "went wrong", "type": "t"}},
        headers={"x-request-id": "rid-9", "x-queue-depth": "12", "x-load-shed": "queue_full"},
    )
    client = api.client(retry_policy=NO_RETRY)
    with pytest.raises(cls) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert type(err) is cls
    assert isinstance(err, stormguard.StormguardError)
    assert err.status_code == status
    assert err.request_id == "rid-9"
    assert err.server_load.queue_depth == 12
    assert err.server_load.load_shed == "queue_full"
    assert "went wrong" in str(err)
    # openai-python's meaning: the body's ``error`` object, and its fields.
    assert err.body == {"message": "went wrong", "type": "t"}
    assert (err.type, err.code, err.param) == ("t", None, None)
    assert err.request is not None and err.request.url.path.endswith("/chat/completions")
    assert err.response is not None and err.response.request is err.request


async def test_503_is_also_an_internal_server_error() -> None:
    assert issubclass(stormguard.ServiceUnavailableError, stormguard.InternalServerError)


async def test_error_bodies_that_are_not_openai_shaped(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(422, json={"detail": [{"loc": ["body"], "msg": "bad"}]}),
            httpx.Response(502, text="<html>" + "x" * 5000 + "</html>"),
            httpx.Response(400, content=b"\xff\xfe\x00garbage"),
        ]
    )
    client = api.client(retry_policy=NO_RETRY)
    with pytest.raises(stormguard.UnprocessableEntityError, match="bad"):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    with pytest.raises(stormguard.InternalServerError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert len(str(info.value)) < 600  # a huge error page is cut, not quoted whole
    with pytest.raises(stormguard.BadRequestError):
        await api.run(client.chat.completions.create(messages=MESSAGES))


@pytest.mark.parametrize(
    ("response", "match"),
    [
        (httpx.Response(200, content=b"{not json"), "not a JSON object"),
        (httpx.Response(200, json=[1, 2]), "not a JSON object"),
        (httpx.Response(200, content=b""), "not a JSON object"),
        (
            httpx.Response(200, text="<html>hi</html>", headers={"content-type": "text/html"}),
            "JSON",
        ),
    ],
)
async def test_malformed_success_bodies(
    api: Api, mock: respx.MockRouter, response: httpx.Response, match: str
) -> None:
    mock.post("/chat/completions").mock(return_value=response)
    client = api.client()
    with pytest.raises(stormguard.APIResponseValidationError, match=match) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.attempts == 1  # a broken 200 is not retried
    assert info.value.retry_stopped_by == "not_retryable"


async def test_huge_body_is_refused_not_buffered(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(200, content=b"x" * 5000)
    client = api.client(max_response_bytes=1000)
    with pytest.raises(stormguard.APIResponseValidationError, match="max_response_bytes"):
        await api.run(client.chat.completions.create(messages=MESSAGES))


async def test_garbage_and_absurd_headers_never_raise(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(
        200,
        json=chat_json(),
        headers={
            "x-queue-depth": "-3",
            "x-queue-tokens": "lots",
            "x-inflight-tokens": "1e400",
            "x-token-capacity": "9" * 100,
            "x-kv-cache-usage": "NaN",
            "retry-after": "Fri, 31 Dec 9999 23:59:59 GMT",
            "x-should-retry": "maybe",
            "x-load-shed": "x" * 500,
        },
    )
    resp = await api.run(api.client().chat.completions.create(messages=MESSAGES))
    assert resp.server_load.is_empty


async def test_connection_error_and_timeout_classes(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions")
    client = api.client(retry_policy=NO_RETRY)
    route.side_effect = httpx.ConnectError("refused")
    with pytest.raises(stormguard.APIConnectionError) as conn:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert not isinstance(conn.value, stormguard.APITimeoutError)
    route.side_effect = httpx.ReadTimeout("slow")
    with pytest.raises(stormguard.APITimeoutError):
        await api.run(client.chat.completions.create(messages=MESSAGES))


async def test_api_key_never_in_messages_or_reprs(api: Api, mock: respx.MockRouter) -> None:
    secret = "sk-test-secret-key"
    mock.post("/chat/completions").respond(
        401, json={"error": {"message": f"Incorrect API key provided: {secret}"}}
    )
    client = api.client(retry_policy=NO_RETRY)
    with pytest.raises(stormguard.AuthenticationError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    for text in (str(info.value), repr(info.value), repr(client), info.value.message):
        assert secret not in text
    assert "[redacted]" in str(info.value)


@pytest.mark.parametrize("at", [480, 495, 499], ids=lambda at: f"key at {at}")
@pytest.mark.parametrize("as_json", [True, False], ids=["json message", "plain text body"])
async def test_a_key_straddling_the_quote_limit_is_scrubbed_whole(
    api: Api, mock: respx.MockRouter, at: int, as_json: bool
) -> None:
    """Server text quoted in an error is cut at 500 characters: scrubbing comes first,
    so a key that the cut would split does not leak its first half."""
    secret = "sk-test-secret-key-0123456789"
    text = "x" * at + secret + "y" * 100
    body = {"json": {"error": {"message": text}}} if as_json else {"text": text}
    mock.post("/chat/completions").respond(401, **body)
    client = api.client(api_key=secret, retry_policy=NO_RETRY)
    with pytest.raises(stormguard.AuthenticationError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    for shown in (str(info.value), repr(info.value), info.value.message):
        assert secret[:4] not in shown, shown[-80:]


def test_a_password_in_the_base_url_is_not_in_the_repr() -> None:
    client = stormguard.Client(base_url="http://user:sk-url-secret@llm.test:8000/v1")
    assert "sk-url-secret" not in repr(client) and "llm.test:8000" in repr(client)
    client.close()


async def test_api_key_from_environment(
    api: Api, mock: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = mock.get("/models").respond(200, json={"object": "list", "data": []})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("STORMGUARD_API_KEY", "sk-stormguard")
    await api.run(api.client(api_key=None).models.list())
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-stormguard"
    monkeypatch.delenv("STORMGUARD_API_KEY")
    await api.run(api.client(api_key=None).models.list())
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-openai"
    monkeypatch.delenv("OPENAI_API_KEY")
    await api.run(api.client(api_key=None).models.list())
    assert "authorization" not in route.calls.last.request.headers


async def test_caller_supplied_http_client_is_used_and_not_closed(api: Api) -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=chat_json())

    transport = httpx.MockTransport(handler)
    http = (
        httpx.Client(transport=transport)
        if api.mode == "sync"
        else httpx.AsyncClient(transport=transport)
    )
    client = api.client(http_client=http)
    await api.run(client.chat.completions.create(messages=MESSAGES))
    await api.run(client.close())
    assert len(seen) == 1
    assert not http.is_closed
    await api.run(http.close() if api.mode == "sync" else http.aclose())


def test_context_managers_close_the_pool() -> None:
    with stormguard.Client(base_url="http://x/v1") as client:
        pass
    assert client._http.is_closed


async def test_async_context_manager_closes_the_pool() -> None:
    async with stormguard.AsyncClient(base_url="http://x/v1") as client:
        pass
    assert client._http.is_closed


@pytest.mark.parametrize("bad", ["ftp://x", "not a url", ""])
def test_bad_base_url(bad: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        stormguard.Client(base_url=bad)


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_bad_timeout(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        stormguard.Client(base_url="http://x/v1", timeout=bad)


def test_public_api_is_sorted_and_importable() -> None:
    assert stormguard.__all__ == sorted(stormguard.__all__, key=lambda n: (not n.isupper(), n))
    for name in stormguard.__all__:
        assert hasattr(stormguard, name), name


def test_wrong_http_client_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"httpx\.Client"):
        stormguard.Client(base_url="http://x/v1", http_client=httpx.AsyncClient())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"httpx\.AsyncClient"):
        stormguard.AsyncClient(base_url="http://x/v1", http_client=httpx.Client())  # type: ignore[arg-type]
