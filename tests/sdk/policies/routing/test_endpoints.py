"""Several endpoints: power of two choices on fresh load, retries elsewhere."""

from __future__ import annotations

import random
from collections import Counter

import httpx
import pytest
import respx

import stormguard
from stormguard import Endpoint, ServerLoad
from stormguard._policies.routing.picker import EndpointPicker
from stormguard.protocol import Priority
from stormguard.testing import FakeClock
from tests.sdk.helpers import MESSAGES, Api, chat_json

A, B, C = "http://a.test/v1", "http://b.test/v1", "http://c.test/v1"


def picker(*endpoints: Endpoint, seed: int = 0) -> tuple[EndpointPicker, FakeClock]:
    clock = FakeClock()
    return EndpointPicker(endpoints, clock=clock, rng=random.Random(seed)), clock


def test_two_choices_prefer_the_less_loaded_fresh_report() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe(a, ServerLoad(queue_depth=30))
    pick.observe(b, ServerLoad(queue_depth=1))
    assert {pick.candidates()[0].name for _ in range(50)} == {"b.test:80"}


def test_stale_reports_are_ignored() -> None:
    pick, clock = picker(Endpoint(A), Endpoint(B))
    a, _ = pick.states
    pick.observe(a, ServerLoad(queue_depth=30))
    clock.advance(6.0)  # older than stale_after (5 s): a is not known to be busy any more
    firsts = Counter(pick.candidates()[0].name for _ in range(400))
    assert 150 < firsts["a.test:80"] < 250


def test_token_share_and_local_in_flight_count() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe(a, ServerLoad(queue_depth=0, inflight_tokens=900, token_capacity=1000))
    pick.observe(b, ServerLoad(queue_depth=0, inflight_tokens=100, token_capacity=1000))
    assert pick.candidates()[0] is b
    for _ in range(3):
        pick.started(b)  # this client already has three attempts in flight at b
    assert pick.candidates()[0] is a
    for _ in range(3):
        pick.finished(b)
    assert pick.candidates()[0] is b


@pytest.mark.parametrize(
    ("alone", "beside"),
    [
        (Endpoint(A, models=["big"]), Endpoint(B, models=["big"])),
        (Endpoint(A, classes={"sheddable"}), Endpoint(B, classes={"sheddable"})),
    ],
    ids=["model", "class"],
)
def test_a_lone_endpoint_is_chosen_as_one_of_several_would_be(
    alone: Endpoint, beside: Endpoint
) -> None:
    one, _ = picker(alone)
    two, _ = picker(alone, beside)
    refusals = set()
    for pick in (one, two):  # the call's model, or its class, served by none
        with pytest.raises(ValueError) as refused:
            pick.choose(model="huge", priority=Priority.STANDARD)
        refusals.add(str(refused.value))
    assert len(refusals) == 1  # the same refusal, one endpoint or two
    served = {"model": "big", "priority": Priority.SHEDDABLE}
    (state,) = one.states
    assert one.choose(**served) == ([state], None)
    assert one.choose(**served, usable=lambda s: False) == ([], None)
    assert one.choose(**served, avoid=state.name, affinity_key=b"k") == ([state], None)


def test_weights_share_the_draws() -> None:
    pick, _ = picker(Endpoint(A, weight=3.0), Endpoint(B), Endpoint(C), seed=7)
    firsts = Counter(pick.candidates()[0].name for _ in range(3000))
    # With equal load P2C picks either draw; a weight-3 endpoint is drawn far more often.
    assert firsts["a.test:80"] > firsts["b.test:80"] + firsts["c.test:80"] - 300


def test_avoid_puts_the_previous_endpoint_last_unless_alone() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B), Endpoint(C))
    for _ in range(50):
        order = [s.name for s in pick.candidates(avoid="a.test:80")]
        assert order[-1] == "a.test:80" and len(order) == 3
    solo, _ = picker(Endpoint(A))
    assert [s.name for s in solo.candidates(avoid="a.test:80")] == ["a.test:80"]


def test_bad_endpoint_lists() -> None:
    with pytest.raises(ValueError, match="empty"):
        stormguard.Client(base_url=[])
    with pytest.raises(ValueError, match="http"):
        stormguard.Client(base_url=[A, "gopher://x"])
    with pytest.raises(ValueError, match="unique"):
        stormguard.Client(base_url=[A, A])
    with pytest.raises(ValueError, match="weight"):
        Endpoint(A, weight=0)


async def test_a_retry_goes_to_another_endpoint(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        seen: list[str] = []

        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request.url.host)
            if len(seen) == 1:
                return httpx.Response(503, json={})
            return httpx.Response(200, json=chat_json())

        mock.post(url__regex=r"http://[abc]\.test/v1/chat/completions").mock(side_effect=answer)
        client = api.client(base_url=[A, B, C])
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert seen[0] != seen[1]
    assert [a.endpoint for a in resp.attempt_history] == [f"{h}:80" for h in seen]


async def test_load_headers_steer_later_calls(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        mock.post(f"{A}/chat/completions").respond(
            200, json=chat_json(), headers={"x-queue-depth": "40"}
        )
        mock.post(f"{B}/chat/completions").respond(
            200, json=chat_json(), headers={"x-queue-depth": "0"}
        )
        client = api.client(base_url=[Endpoint(A, name="gpu-a"), Endpoint(B, name="gpu-b")])
        served = Counter()
        for _ in range(40):
            resp = await api.run(client.chat.completions.create(messages=MESSAGES))
            served[resp.attempt_history[-1].endpoint] += 1
    # Once each has reported, b (queue 0) wins every two-choice draw against a (queue 40).
    assert served["gpu-a"] <= 2
    assert client.base_url == A


async def test_models_per_endpoint_route_calls_and_fallbacks(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        big = mock.post(f"{A}/chat/completions").respond(
            503, json={}, headers={"x-load-shed": "queue_full"}
        )
        small = mock.post(f"{B}/chat/completions").respond(200, json=chat_json())
        client = api.client(
            base_url=[
                Endpoint(A, models=["big"]),
                Endpoint(B, models=frozenset({"small"})),
            ],
            model="big",
            fallback_models=["small"],
            retry_policy=stormguard.RetryPolicy(max_attempts=2),
            concurrency=None,  # sheds retried, not requeued: two attempts exactly
        )
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.degraded and resp.served_model == "small"
    assert big.call_count == 2  # both attempts of "big" went to the only server that has it
    assert small.call_count == 1


def test_a_model_no_endpoint_serves_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="serves model 'huge'"):
        stormguard.Client(base_url=[Endpoint(A, models=["big"])], model="huge")
    with pytest.raises(ValueError, match="serves model 'tiny'"):
        stormguard.Client(
            base_url=[Endpoint(A, models=["big"])], model="big", fallback_models=["tiny"]
        )
    with pytest.raises(TypeError, match="models"):
        Endpoint(A, models="big")  # type: ignore[arg-type]


async def test_retry_after_of_one_server_does_not_delay_a_retry_to_another(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        mock.post(f"{A}/chat/completions").respond(503, json={}, headers={"retry-after": "30"})
        mock.post(f"{B}/chat/completions").respond(200, json=chat_json())
        client = api.client(base_url=[A, B], breaker=None)
        for _ in range(20):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert api.clock.sleeps, "some calls went to a first and were retried on b"
    assert max(api.clock.sleeps) <= 0.5  # the jittered backoff, not a's 30 s


async def test_retry_after_is_honoured_when_the_retry_goes_back_to_the_same_server(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(503, json={}, headers={"retry-after": "7"}),
            httpx.Response(200, json=chat_json()),
        ]
    )
    await api.run(api.client().chat.completions.create(messages=MESSAGES))
    assert api.clock.sleeps == [7.0]
