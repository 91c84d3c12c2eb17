"""``Client(openai_errors=True)``: what a call raises is caught by ``except openai.X``
and by ``except stormguard.X``, and reads exactly as without the option."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import httpx
import httpx2
import openai
import pytest
import respx

import stormguard
from stormguard import openai_errors
from stormguard._core import exceptions as _exceptions
from stormguard._policies.breaker.config import BreakerConfig
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import BASE, MESSAGES, Api, chat_json, chunk, event_stream, sse

NO_RETRY = stormguard.RetryPolicy(max_attempts=1)

# Every openai-python attribute of an error, and stormguard's own.
OPENAI_FIELDS = ("message", "body", "code", "param", "type", "request_id")
STATUS_FIELDS = ("status_code", "raw_body")
OWN_FIELDS = ("attempts", "retry_stopped_by", "server_load", "rate_limit", "precheck")

STATUS_CASES = [
    (400, "BadRequestError"),
    (401, "AuthenticationError"),
    (403, "PermissionDeniedError"),
    (404, "NotFoundError"),
    (409, "ConflictError"),
    (418, "APIStatusError"),
    (422, "UnprocessableEntityError"),
    (429, "RateLimitError"),
    (500, "InternalServerError"),
    (502, "InternalServerError"),
]


def error_response(status: int) -> httpx.Response:
    body = {
        "error": {
            "message": f"refused with {status}",
            "type": "invalid_request_error",
            "param": "messages",
            "code": f"code_{status}",
        }
    }
    headers = {
        "x-request-id": f"req-{status}",
        "x-queue-depth": "4",
        "x-ratelimit-remaining-requests": "7",
    }
    return httpx.Response(status, json=body, headers=headers)


async def raised(api: Api, **options: Any) -> Exception:
    """The error of one chat call on a new client with ``options``."""
    client = api.client(retry_policy=NO_RETRY, concurrency=None, **options)
    with pytest.raises(stormguard.StormguardError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    return info.value


def reading(err: Any) -> dict[str, Any]:
    """Everything an error says, as comparable values."""
    names = OPENAI_FIELDS + OWN_FIELDS + (STATUS_FIELDS if hasattr(err, "status_code") else ())
    seen: dict[str, Any] = {name: getattr(err, name) for name in names}
    seen["history"] = [(a.status_code, a.outcome) for a in err.attempt_history]
    request = getattr(err, "request", None)
    seen["request"] = None if request is None else (request.method, str(request.url))
    response = getattr(err, "response", None)
    seen["response"] = None if response is None else response.status_code
    seen["repr"], seen["str"], seen["name"] = repr(err), str(err), type(err).__name__
    return seen


@pytest.mark.parametrize(("status", "name"), STATUS_CASES)
async def test_a_status_error_is_openais_and_stormguards_and_reads_the_same(
    api: Api, mock: respx.MockRouter, status: int, name: str
) -> None:
    mock.post("/chat/completions").mock(side_effect=lambda _: error_response(status))
    plain = await raised(api)
    err = await raised(api, openai_errors=True)
    assert isinstance(err, getattr(openai, name)) and isinstance(err, openai.APIStatusError)
    assert isinstance(err, getattr(stormguard, name))
    assert not isinstance(plain, openai.OpenAIError)  # the option, and only it, adds openai's
    assert type(err).__module__ == "stormguard.openai_errors" and type(plain) is not type(err)
    assert type(err).__mro__[1] is type(plain)
    assert reading(err) == reading(plain)
    assert err.request is not None and err.response is not None  # type: ignore[attr-defined]
    assert err.response.request is err.request  # type: ignore[attr-defined]


async def test_a_503_is_openais_internal_server_error(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(503, json={}, headers={"x-load-shed": "queue_full"})
    err = await raised(api, openai_errors=True)
    assert isinstance(err, stormguard.ServiceUnavailableError)
    assert isinstance(err, openai.InternalServerError)
    assert err.server_load.load_shed == "queue_full"  # type: ignore[attr-defined]


async def test_the_attributes_read_as_openais_own_error_of_the_same_answer(
    api: Api, mock: respx.MockRouter
) -> None:
    answer = {
        "error": {
            "message": "You exceeded your current quota.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    headers = {"x-request-id": "req-q"}
    mock.post("/chat/completions").respond(429, json=answer, headers=headers)
    ours = await raised(api, openai_errors=True)

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(429, json=answer, headers=headers)

    with (
        openai.OpenAI(
            base_url=BASE,
            api_key="sk-test-secret-key",
            max_retries=0,
            http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        ) as client,
        pytest.raises(openai.RateLimitError) as info,
    ):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    theirs = info.value
    assert isinstance(ours, openai.RateLimitError)
    for name in ("message", "body", "code", "param", "type", "status_code", "request_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert str(ours.request.url) == str(theirs.request.url)
    assert ours.response.status_code == theirs.response.status_code
    assert ours.retry_stopped_by == "not_retryable"  # type: ignore[attr-defined]


async def test_connection_errors_and_timeouts(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
    err = await raised(api, openai_errors=True)
    assert isinstance(err, openai.APIConnectionError) and isinstance(
        err, stormguard.APIConnectionError
    )
    assert not isinstance(err, openai.APITimeoutError)
    assert isinstance(err.__cause__, httpx.ConnectError)  # the same object, its cause kept
    assert err.body is None and err.request.url == httpx.URL(f"{BASE}/chat/completions")
    route.mock(side_effect=httpx.ReadTimeout("slow"))
    err = await raised(api, openai_errors=True)
    assert isinstance(err, openai.APITimeoutError) and isinstance(err, stormguard.APITimeoutError)


async def test_an_open_breaker_is_an_openai_connection_error_with_openais_fields(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(500, json={})
    trip = BreakerConfig(consecutive_failures=1, open_time=5.0, jitter=0.0)
    client = api.client(retry_policy=NO_RETRY, breaker=trip, openai_errors=True)
    with pytest.raises(openai.InternalServerError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    with pytest.raises(openai.APIConnectionError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert isinstance(err, stormguard.CircuitOpenError) and route.call_count == 1
    assert (err.request, err.body, err.code, err.param, err.type) == (None,) * 5
    assert err.request_id is None  # type: ignore[attr-defined]
    assert err.breaker and repr(err).startswith("CircuitOpenError(")
    assert not hasattr(err, "status_code")


async def test_a_context_window_refusal_is_openais_bad_request(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    policy = TokenPolicy(
        server_context_windows=False, server_tokenize=False, context_windows={"gpt-4o": 300}
    )
    client = api.client(model="gpt-4o", token_policy=policy, openai_errors=True)
    long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(openai.BadRequestError) as info:
        await api.run(client.chat.completions.create(messages=long, max_tokens=50))
    err = info.value
    assert isinstance(err, stormguard.ContextWindowExceededError) and isinstance(err, ValueError)
    assert (err.status_code, err.code, err.response) == (400, "context_length_exceeded", None)
    assert route.call_count == 0


async def test_errors_raised_while_reading_a_stream(api: Api, mock: respx.MockRouter) -> None:
    event = {"error": {"message": "engine died", "type": "server_error", "code": 500}}
    route = mock.post("/chat/completions").mock(
        return_value=event_stream(sse(chunk("hi"), json.dumps(event), done=False))
    )
    client = api.client(retry_policy=NO_RETRY, concurrency=None, openai_errors=True)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(openai.InternalServerError) as info:
        await api.collect(stream)
    assert isinstance(info.value, stormguard.InternalServerError)
    assert info.value.code == "500" and info.value.attempts == 1  # type: ignore[attr-defined]
    # Cut after its first chunk: stormguard's StreamInterruptedError, openai's connection error.
    route.mock(return_value=event_stream(sse(chunk("hi"), done=False)))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(openai.APIConnectionError) as cut:
        await api.collect(stream)
    assert isinstance(cut.value, stormguard.StreamInterruptedError)
    assert cut.value.chunks_received == 1  # type: ignore[attr-defined]


async def test_an_error_reading_a_streaming_response_after_the_hand_over(
    api: Api, mock: respx.MockRouter
) -> None:
    big = {"id": "big", "object": "model", "pad": "x" * 200}
    mock.get("/models/big").respond(200, json=big)
    client = api.client(max_response_bytes=64, openai_errors=True)
    async with contextlib.AsyncExitStack() as stack:
        manager = client.models.with_streaming_response.retrieve("big")
        if api.mode == "sync":
            response = stack.enter_context(manager)
        else:
            response = await stack.enter_async_context(manager)
        with pytest.raises(openai.APIResponseValidationError) as info:
            await api.run(response.parse())
    assert isinstance(info.value, stormguard.APIResponseValidationError)
    assert info.value.attempts == 1  # type: ignore[attr-defined]


async def test_a_client_from_with_options_keeps_the_option(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").respond(429, json={"error": {"message": "slow down"}})
    client = api.client(retry_policy=NO_RETRY, concurrency=None, openai_errors=True)
    with pytest.raises(openai.RateLimitError):
        await api.run(client.with_options(timeout=5).chat.completions.create(messages=MESSAGES))


def test_the_classes_are_built_once_and_cover_every_error_stormguard_raises() -> None:
    for name in _exceptions.__all__:
        cls = getattr(_exceptions, name)
        if isinstance(cls, type):
            assert cls in openai_errors.OPENAI_CLASSES, name
    for ours, theirs in openai_errors.OPENAI_CLASSES.items():
        built = openai_errors.openai_class(ours)
        assert built is openai_errors.openai_class(ours)
        assert built.__mro__[1] is ours and issubclass(built, getattr(openai, theirs))
        assert built.__name__ == ours.__name__
        assert getattr(openai_errors, ours.__name__) is built
    with pytest.raises(AttributeError):
        _ = openai_errors.NoSuchError


def test_stormguards_constructor_builds_the_class_that_is_also_openais() -> None:
    cls = openai_errors.openai_class(stormguard.RateLimitError)
    err = cls("Error code: 429 - slow", status_code=429, body={"code": "rate", "type": "t"})
    assert isinstance(err, openai.RateLimitError) and isinstance(err, stormguard.RateLimitError)
    assert (err.message, str(err), err.code, err.type, err.param) == (
        "Error code: 429 - slow",
        "Error code: 429 - slow",
        "rate",
        "t",
        None,
    )
    assert err.status_code == 429 and err.response is None and err.attempts == 0
    assert repr(err) == "RateLimitError(status_code=429, 'Error code: 429 - slow')"
    timeout = openai_errors.openai_class(stormguard.QueueTimeoutError)("waited", queued_s=1.5)
    assert isinstance(timeout, openai.APITimeoutError) and timeout.queued_s == 1.5


def test_converting_leaves_the_object_and_other_classes_alone() -> None:
    err = stormguard.NotFoundError("gone", status_code=404)
    assert openai_errors.as_openai_error(err) is err and isinstance(err, openai.NotFoundError)
    again = type(err)
    assert openai_errors.as_openai_error(err) is err and type(err) is again

    class Custom(stormguard.APIError):
        pass

    custom = Custom("mine")
    assert type(openai_errors.as_openai_error(custom)) is Custom


def test_without_the_openai_package_the_client_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_errors, "_built", None)
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai now fails
    with pytest.raises(ImportError, match="pip install openai"):
        stormguard.Client(base_url=BASE, api_key="k", openai_errors=True)
    stormguard.Client(base_url=BASE, api_key="k").close()  # the option off needs nothing


def test_the_option_is_a_bool() -> None:
    with pytest.raises(TypeError, match="openai_errors must be True or False"):
        stormguard.Client(base_url=BASE, api_key="k", openai_errors="yes")  # type: ignore[arg-type]
