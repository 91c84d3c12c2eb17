"""Errors with openai-python's attributes and meanings: request, body, code, param,
type, request_id, response; a context-window refusal as a BadRequestError."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

import stormguard
from stormguard._core.redact import REDACTED
from stormguard._core.verdict import LimitOutcome, classify
from stormguard._policies.fallback import is_fallback_worthy
from stormguard._policies.limiter.limiter import is_shed, limit_outcome
from stormguard._policies.retry.throttle import AdaptiveThrottle, is_accept
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import MESSAGES, Api, chunk, event_stream, sse

NO_RETRY = stormguard.RetryPolicy(max_attempts=1)
KEY = "sk-proj-echoed-0123456789abcdef"


async def failing_call(api: Api, mock: respx.MockRouter, response: httpx.Response) -> Exception:
    mock.post("/chat/completions").mock(return_value=response)
    client = api.client(retry_policy=NO_RETRY, concurrency=None)
    with pytest.raises(stormguard.APIError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    return info.value


async def test_an_openai_error_body_gives_code_param_type_and_the_error_object(
    api: Api, mock: respx.MockRouter
) -> None:
    error_object = {
        "message": "Invalid value for temperature",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "invalid_value",
    }
    err = await failing_call(
        api,
        mock,
        httpx.Response(400, json={"error": error_object}, headers={"x-request-id": "req-7"}),
    )
    assert isinstance(err, stormguard.BadRequestError)
    assert err.body == error_object  # the error object, as openai-python's ``body``
    assert (err.code, err.param, err.type) == (
        "invalid_value",
        "temperature",
        "invalid_request_error",
    )
    assert err.message == "Error code: 400 - Invalid value for temperature"
    assert err.request_id == "req-7" and err.status_code == 400
    assert isinstance(err.request, httpx.Request) and err.request.method == "POST"
    assert json.loads(err.request.content)["messages"] == MESSAGES
    assert err.response is not None and err.response.request is err.request


@pytest.mark.parametrize(
    ("status", "payload", "fields"),
    [
        pytest.param(
            400,
            {
                "object": "error",
                "message": "too long",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            ("400", None, "BadRequestError"),
            id="vllm-flat",
        ),
        pytest.param(
            503,
            {"error": {"message": "busy", "type": "ServiceUnavailableError", "code": 503}},
            ("503", None, "ServiceUnavailableError"),
            id="vllm-nested",
        ),
        pytest.param(
            429,
            {"error": {"message": "rate", "type": "None", "param": "None", "code": "429"}},
            ("429", None, None),
            id="litellm-proxy",
        ),
        pytest.param(
            422,
            {"detail": [{"loc": ["body"], "msg": "bad"}]},
            (None, None, None),
            id="fastapi",
        ),
        pytest.param(
            400,
            {"error": {"message": "m", "code": True, "param": ["a"], "type": {"x": 1}}},
            (None, None, None),
            id="wrong-types",
        ),
        pytest.param(
            400,
            {"error": {"message": "m", "type": "t" * 10_000}},
            (None, None, "t" * 200),
            id="huge-type",
        ),
    ],
)
async def test_error_body_variants(
    api: Api,
    mock: respx.MockRouter,
    status: int,
    payload: dict[str, object],
    fields: tuple[str | None, str | None, str | None],
) -> None:
    err = await failing_call(api, mock, httpx.Response(status, json=payload))
    assert (err.code, err.param, err.type) == fields  # type: ignore[attr-defined]
    expected_body = payload.get("error", payload)
    assert err.body == expected_body  # type: ignore[attr-defined]


async def test_a_text_error_body_is_the_body_with_no_fields(
    api: Api, mock: respx.MockRouter
) -> None:
    err = await failing_call(api, mock, httpx.Response(502, text="<html>bad gateway</html>"))
    assert isinstance(err, stormguard.InternalServerError)
    assert err.body == "<html>bad gateway</html>"
    assert (err.code, err.param, err.type) == (None, None, None)


async def test_a_connection_error_carries_the_request_and_no_body(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
    client = api.client(retry_policy=NO_RETRY, concurrency=None)
    with pytest.raises(stormguard.APIConnectionError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert isinstance(err.request, httpx.Request)
    assert err.request.url == httpx.URL("http://llm.test/v1/chat/completions")
    assert err.body is None and (err.code, err.param, err.type) == (None, None, None)


async def test_an_error_event_in_a_stream_has_the_fields_and_the_request(
    api: Api, mock: respx.MockRouter
) -> None:
    event = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
    mock.post("/chat/completions").mock(
        return_value=event_stream(sse(chunk("hi"), json.dumps(event), done=False))
    )
    client = api.client(retry_policy=NO_RETRY, concurrency=None)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.InternalServerError) as info:
        await api.collect(stream)
    err = info.value
    assert err.body == event["error"] and (err.code, err.type) == ("500", "InternalServerError")
    assert isinstance(err.request, httpx.Request) and err.request.url.path.endswith("/completions")


async def test_a_key_echoed_in_code_param_type_and_body_is_scrubbed(
    api: Api, mock: respx.MockRouter
) -> None:
    echoed = {
        "message": "no",
        "code": KEY,
        "param": f"p {KEY}",
        "type": f"{KEY}-type",
        "extra": [KEY],
    }
    mock.post("/chat/completions").respond(401, json={"error": echoed})
    client = api.client(api_key=KEY, retry_policy=NO_RETRY, concurrency=None)
    with pytest.raises(stormguard.AuthenticationError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert (err.code, err.param, err.type) == (REDACTED, f"p {REDACTED}", f"{REDACTED}-type")
    assert KEY not in json.dumps(err.body) and REDACTED in json.dumps(err.body)
    assert KEY not in str(err) + repr(err) + err.message
    assert err.raw_body is not None and KEY.encode() in err.raw_body  # as it came


def test_scrub_error_scrubs_a_json_body_built_by_hand() -> None:
    from stormguard._core.redact import Redactor

    err = stormguard.RateLimitError("x", status_code=429, body={"code": KEY, "nested": [KEY]})
    Redactor([KEY]).scrub_error(err)
    assert err.body == {"code": REDACTED, "nested": [REDACTED]}
    assert err.code == REDACTED


# -- the context-window refusal -------------------------------------------------------


def context_window_error() -> stormguard.ContextWindowExceededError:
    return stormguard.ContextWindowExceededError(
        "m: 900 prompt tokens + 200 max tokens = 1100 exceeds the context window of 1000",
        model="m",
        prompt_tokens=900,
        max_tokens=200,
        context_window=1000,
        counter="c",
    )


def test_a_context_window_refusal_is_a_bad_request_as_litellms_is() -> None:
    err = context_window_error()
    assert isinstance(err, stormguard.BadRequestError)
    assert isinstance(err, stormguard.RefusedBeforeSendError) and isinstance(err, ValueError)
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert err.type == "invalid_request_error" and err.param is None
    assert err.request is None and err.response is None and err.raw_body is None
    assert err.body == {
        "message": err.message,
        "type": "invalid_request_error",
        "param": None,
        "code": "context_length_exceeded",
    }
    assert (err.model, err.prompt_tokens, err.max_tokens) == ("m", 900, 200)


def test_a_context_window_refusal_is_no_failure_of_anything() -> None:
    err = context_window_error()
    assert stormguard.RetryPolicy().decide(err).retry is False
    assert not classify(err).breaker_failure
    assert not is_fallback_worthy(err)
    assert not is_shed(err) and limit_outcome(err) is LimitOutcome.IGNORED
    assert not is_accept(err)
    throttle = AdaptiveThrottle(clock=FakeClock())
    throttle.record(err)  # nothing was sent: neither an accept nor a reject
    assert (throttle.state().requests, throttle.state().accepts) == (0, 0)


async def test_a_context_window_refusal_through_the_client_sends_nothing(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json={})
    policy = TokenPolicy(
        server_context_windows=False, server_tokenize=False, context_windows={"gpt-4o": 300}
    )
    client = api.client(model="gpt-4o", token_policy=policy)
    long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(stormguard.BadRequestError) as info:
        await api.run(client.chat.completions.create(messages=long, max_tokens=50))
    err = info.value
    assert isinstance(err, stormguard.ContextWindowExceededError)
    assert route.call_count == 0 and err.attempts == 0 and err.retry_stopped_by is None
    assert err.request is None and err.code == "context_length_exceeded"
