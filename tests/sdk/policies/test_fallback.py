"""Fallback to a smaller model: when it happens, when it must not, what the result says."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

import stormguard
from stormguard import RetryPolicy, ServerLoad
from stormguard._policies.fallback import is_fallback_worthy
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse


def by_model(responses: dict[str, list[httpx.Response]]) -> object:
    """A respx side effect that answers per requested model, in order."""

    def answer(request: httpx.Request) -> httpx.Response:
        return responses[json.loads(request.content)["model"]].pop(0)

    return answer


def shed(reason: str = "queue_full", status: int = 503) -> httpx.Response:
    return httpx.Response(
        status,
        json={"error": {"message": "shed"}},
        headers={"x-load-shed": reason, "x-should-retry": "false", "retry-after": "1"},
    )


async def test_shed_primary_falls_back_and_says_degraded(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=by_model({"big": [shed()], "small": [httpx.Response(200, json=chat_json())]})
    )
    client = api.client(model="big", fallback_models=["small", "tiny"])
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.degraded is True
    assert resp.served_model == "small"
    assert resp.call_info.degraded_from == "big"
    sent = [json.loads(c.request.content)["model"] for c in route.calls]
    assert sent == ["big", "small"]
    attempts = [c.request.headers["x-stormguard-attempt"] for c in route.calls]
    assert attempts == ["1", "1"]  # the fallback's first try is no retry of the primary
    assert [(a.model, a.outcome) for a in resp.attempt_history] == [
        ("big", "should_retry_false"),
        ("small", "ok"),
    ]
    assert client.stats().fallbacks == 1


async def test_out_of_retries_for_overload_falls_back(api: Api, mock: respx.MockRouter) -> None:
    busy = [httpx.Response(503, json={}) for _ in range(3)]
    mock.post("/chat/completions").mock(
        side_effect=by_model({"big": busy, "small": [httpx.Response(200, json=chat_json())]})
    )
    client = api.client(model="big", fallback_models=["small"], concurrency=None)
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.degraded and resp.attempts == 4
    assert [a.outcome for a in resp.attempt_history] == ["retry", "retry", "max_attempts", "ok"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
async def test_caller_faults_never_fall_back(api: Api, mock: respx.MockRouter, status: int) -> None:
    route = mock.post("/chat/completions").respond(status, json={"error": {"message": "no"}})
    client = api.client(model="big", fallback_models=["small"])
    with pytest.raises(stormguard.APIStatusError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.status_code == status
    assert route.call_count == 1
    assert client.stats().fallbacks == 0


async def test_too_long_never_falls_back(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(return_value=shed("too_long", status=400))
    client = api.client(model="big", fallback_models=["small"])
    with pytest.raises(stormguard.BadRequestError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1


async def test_every_model_failing_raises_the_last_error_with_all_attempts(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=by_model({"big": [shed()], "small": [shed("token_budget")]})
    )
    client = api.client(model="big", fallback_models=["small"])
    with pytest.raises(stormguard.ServiceUnavailableError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert err.server_load.load_shed == "token_budget"
    assert err.attempts == 2
    assert [a.model for a in err.attempt_history] == ["big", "small"]


async def test_no_fallback_once_the_deadline_is_spent(api: Api, mock: respx.MockRouter) -> None:
    def slow_shed(request: httpx.Request) -> httpx.Response:
        api.clock.advance(10.0)
        return shed()

    route = mock.post("/chat/completions").mock(side_effect=slow_shed)
    client = api.client(model="big", fallback_models=["small"], timeout=5.0)
    with pytest.raises(stormguard.APITimeoutError):  # the deadline passed during the answer
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1


async def test_streams_fall_back_too(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        side_effect=by_model({"big": [shed()], "small": [event_stream(sse(chunk("ok")))]})
    )
    client = api.client(model="big", fallback_models=["small"])
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert [c.choices[0].delta.content for c in await api.collect(stream)] == ["ok"]
    assert stream.call_info.degraded_from == "big"
    assert stream.call_info.model == "small"


async def test_fallback_list_skips_the_requested_model(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(return_value=shed())
    client = api.client(
        model="big", fallback_models=["big", "small"], retry_policy=RetryPolicy(max_attempts=1)
    )
    with pytest.raises(stormguard.ServiceUnavailableError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [json.loads(c.request.content)["model"] for c in route.calls] == ["big", "small"]


def test_fallback_models_must_be_a_list() -> None:
    with pytest.raises(TypeError, match="fallback_models"):
        stormguard.Client(base_url="http://x/v1", fallback_models="small")


def overload(status: int, shed_reason: str | None = None) -> stormguard.APIStatusError:
    cls = stormguard._core.exceptions.status_error_class(status)
    return cls("x", status_code=status, server_load=ServerLoad(load_shed=shed_reason))


@pytest.mark.parametrize(
    ("error", "worthy"),
    [
        (overload(503), True),
        (overload(429), True),
        (overload(500), True),
        (overload(400), False),
        (overload(400, "too_long"), False),
        (overload(413), False),
        (stormguard.CircuitOpenError("open", breaker="b"), True),
        (stormguard.APIConnectionError("refused"), True),
        (stormguard.APITimeoutError("t"), True),
        (stormguard.APITimeoutError("t", response_started=True), False),
        (stormguard.StreamInterruptedError("cut", chunks_received=2), False),
        (
            stormguard.ContextWindowExceededError(
                "x", model="m", prompt_tokens=1, max_tokens=1, context_window=1, counter="c"
            ),
            False,
        ),
        (ValueError("bug"), False),
    ],
)
def test_what_is_fallback_worthy(error: BaseException, worthy: bool) -> None:
    assert is_fallback_worthy(error) is worthy
