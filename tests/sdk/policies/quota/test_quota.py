"""A 429 out of quota (``insufficient_quota``) is not retried, not requeued, not a shed."""

from __future__ import annotations

import httpx
import pytest
import respx

import stormguard
from stormguard._core.verdict import LimitOutcome, is_out_of_quota
from stormguard._policies.limiter.limiter import is_shed, limit_outcome
from tests.sdk.helpers import MESSAGES, Api, chat_json

# OpenAI's answer to an account without credit.
OPENAI_QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


@pytest.mark.parametrize(
    "error_object",
    [
        OPENAI_QUOTA["error"],
        {"message": "quota", "type": "insufficient_quota"},
        {"message": "quota", "type": "None", "code": "insufficient_quota"},
    ],
    ids=["openai", "type-only", "code-only"],
)
async def test_a_429_out_of_quota_is_sent_once(
    api: Api, mock: respx.MockRouter, error_object: dict[str, object]
) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(429, json={"error": error_object}, headers={"retry-after": "1"}),
            httpx.Response(200, json=chat_json()),
        ]
    )
    client = api.client()  # default retry policy, concurrency limiter and requeues
    with pytest.raises(stormguard.RateLimitError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert route.call_count == 1
    assert err.retry_stopped_by == "not_retryable" and err.attempts == 1
    assert [a.outcome for a in err.attempt_history] == ["not_retryable"]
    assert client.stats().requeues == 0
    assert api.clock.now() == 0.0  # no Retry-After slept


async def test_x_should_retry_true_does_not_retry_an_empty_account(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(
        429, json=OPENAI_QUOTA, headers={"x-should-retry": "true"}
    )
    client = api.client()
    with pytest.raises(stormguard.RateLimitError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1 and info.value.retry_stopped_by == "not_retryable"


async def test_a_429_over_the_rate_is_still_retried(api: Api, mock: respx.MockRouter) -> None:
    rate = {
        "error": {
            "message": "Rate limit reached",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }
    }
    route = mock.post("/chat/completions").mock(
        side_effect=[httpx.Response(429, json=rate), httpx.Response(200, json=chat_json())]
    )
    client = api.client(concurrency=None)
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 2 and result.attempts == 2


def quota_error(status: int = 429) -> stormguard.APIStatusError:
    cls = stormguard.RateLimitError if status == 429 else stormguard.ServiceUnavailableError
    return cls("quota", status_code=status, body=OPENAI_QUOTA["error"])


def test_out_of_quota_is_no_shed_for_the_limiter() -> None:
    err = quota_error()
    assert is_out_of_quota(err)
    assert not is_shed(err) and limit_outcome(err) is LimitOutcome.IGNORED
    assert stormguard.RetryPolicy().decide(err) == stormguard.RetryPolicy().decide(
        stormguard.BadRequestError("x", status_code=400)
    )


def test_only_a_429_is_out_of_quota() -> None:
    assert not is_out_of_quota(quota_error(503))  # a 503 is the server's load
    assert not is_out_of_quota(None) and not is_out_of_quota(ValueError("x"))
