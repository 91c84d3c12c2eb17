"""A 429 out of quota does not move the call to a fallback model: the account is
empty for every model the client calls. A 429 over the rate still does."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

import stormguard
from stormguard._policies.fallback import is_fallback_worthy
from tests.sdk.helpers import MESSAGES, Api, chat_json

NO_RETRY = stormguard.RetryPolicy(max_attempts=1)
OUT_OF_QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}
OVER_THE_RATE = {
    "error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}
}


def models_sent(route: respx.Route) -> list[str]:
    return [json.loads(call.request.content)["model"] for call in route.calls]


async def test_out_of_quota_raises_without_trying_the_fallback_models(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(429, json=OUT_OF_QUOTA, headers={"retry-after": "1"}),
            httpx.Response(200, json=chat_json()),
        ]
    )
    client = api.client(model="big", fallback_models=["small", "tiny"])
    with pytest.raises(stormguard.RateLimitError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert models_sent(route) == ["big"]
    assert err.code == "insufficient_quota" and err.retry_stopped_by == "not_retryable"
    assert [(a.model, a.outcome) for a in err.attempt_history] == [("big", "not_retryable")]
    assert client.stats().fallbacks == 0
    assert api.clock.now() == 0.0


async def test_over_the_rate_still_falls_back(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(429, json=OVER_THE_RATE),
            httpx.Response(200, json=chat_json()),
        ]
    )
    # Without the quota's pacer (which would hold the call for the key's room, as
    # test_quota_flow.py shows), a 429 over the rate is a refusal like a shed.
    client = api.client(
        model="big",
        fallback_models=["small"],
        retry_policy=NO_RETRY,
        concurrency=None,
        quota=None,
    )
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert models_sent(route) == ["big", "small"] and resp.degraded
    assert client.stats().fallbacks == 1


async def test_a_fallback_model_out_of_quota_ends_the_call_there(
    api: Api, mock: respx.MockRouter
) -> None:
    # The primary is overloaded, the first fallback's answer says the account is empty:
    # the second fallback is not tried.
    route = mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(503, json={}, headers={"x-load-shed": "queue_full"}),
            httpx.Response(429, json=OUT_OF_QUOTA),
            httpx.Response(200, json=chat_json()),
        ]
    )
    client = api.client(
        model="big", fallback_models=["small", "tiny"], retry_policy=NO_RETRY, concurrency=None
    )
    with pytest.raises(stormguard.RateLimitError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert models_sent(route) == ["big", "small"]
    assert client.stats().fallbacks == 1


@pytest.mark.parametrize(
    ("status", "payload", "worthy"),
    [
        (429, OUT_OF_QUOTA, False),
        (429, {"error": {"message": "m", "type": "insufficient_quota"}}, False),
        (429, {"error": {"message": "m", "code": "insufficient_quota"}}, False),
        (429, OVER_THE_RATE, True),
        (503, OUT_OF_QUOTA, True),  # a 503 is the server's load, whatever its body says
    ],
    ids=["openai", "type-only", "code-only", "over-the-rate", "503"],
)
def test_is_fallback_worthy(status: int, payload: dict[str, object], worthy: bool) -> None:
    cls = stormguard.RateLimitError if status == 429 else stormguard.ServiceUnavailableError
    err = cls("x", status_code=status, body=payload["error"])
    assert is_fallback_worthy(err) is worthy
