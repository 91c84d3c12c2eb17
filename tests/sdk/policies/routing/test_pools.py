"""Pools by class, sync and async, on a fake clock: a call goes to the endpoints of its
own priority class; another pool's only with spill-over allowed and fresh headroom;
ejection never empties a pool; failover stays in the pool."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import respx

import stormguard
from stormguard import (
    BreakerConfig,
    CircuitOpenError,
    DiscoveryConfig,
    Endpoint,
    Priority,
    RetryBudget,
    RetryPolicy,
    ServerLoad,
    SpillOver,
)
from stormguard._policies.routing.ejection import EjectionTracker
from stormguard._policies.routing.ejection_config import EjectionConfig
from stormguard._policies.routing.ejection_rules import Evidence
from stormguard._policies.routing.endpoint_state import EndpointState
from stormguard.testing import FakeClock
from tests.sdk.helpers import MESSAGES, Api, chat_json

INTERACTIVE = {"critical", "standard"}
BATCH = {"sheddable"}
I1, I2, B1, B2 = (
    "http://i1.test/v1",
    "http://i2.test/v1",
    "http://b1.test/v1",
    "http://b2.test/v1",
)
ANY_HOST = r"http://[ib][12]\.test/v1/chat/completions"
ROOM = ServerLoad(queue_depth=0, inflight_tokens=100, token_capacity=1000, kv_cache_usage=0.2)


def fleet() -> list[Endpoint]:
    return [
        Endpoint(I1, classes=INTERACTIVE),
        Endpoint(I2, classes=INTERACTIVE),
        Endpoint(B1, classes=BATCH),
        Endpoint(B2, classes=BATCH),
    ]


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=chat_json())


def by_host(**answers: Any) -> Any:
    """Each host its own answer (a response, or a function of the request); the hosts
    asked, in order, are in ``.seen``."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        seen.append(host.split(".")[0])
        reply = answers.get(host.split(".")[0], ok)
        return reply(request) if callable(reply) else reply

    answer.seen = seen  # type: ignore[attr-defined]
    return answer


def failing() -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "engine failed"}})


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def state_of(client: Any, host: str) -> EndpointState:
    return next(s for s in client._core.picker.states if s.name == f"{host}.test:80")


def hosts(history: Sequence[Any]) -> list[str]:
    return [a.endpoint.split(".")[0] for a in history]


async def test_each_class_goes_to_its_own_pool_and_an_untagged_endpoint_serves_every_class(
    api: Api,
) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host()
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        batch = api.client(base_url=fleet(), priority="sheddable")
        interactive = api.client(base_url=fleet())  # standard, by default
        for _ in range(20):
            await api.run(batch.chat.completions.create(messages=MESSAGES))
        assert set(answer.seen) == {"b1", "b2"}
        answer.seen.clear()
        for _ in range(20):
            await api.run(interactive.chat.completions.create(messages=MESSAGES))
        # A call's own x-priority picks its pool too.
        for _ in range(10):
            await api.run(
                interactive.chat.completions.create(
                    messages=MESSAGES, extra_headers={"x-priority": "critical"}
                )
            )
        assert set(answer.seen) == {"i1", "i2"}
        answer.seen.clear()
        mixed = api.client(
            base_url=[Endpoint(I1), Endpoint(B1, classes=BATCH)], priority="critical"
        )
        for _ in range(10):
            await api.run(mixed.chat.completions.create(messages=MESSAGES))
    assert set(answer.seen) == {"i1"}


async def test_a_batch_failover_stays_in_the_batch_pool(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host(b1=refuse, b2=failing())
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = api.client(
            base_url=fleet(),
            priority="sheddable",
            retry_policy=RetryPolicy(max_attempts=6),
        )
        with pytest.raises(stormguard.InternalServerError) as info:
            await api.run(client.chat.completions.create(messages=MESSAGES))
    # b1 refused and was ejected; b2 is the last of its pool: never ejected, and the
    # retries stay on it; the idle interactive replicas see nothing.
    assert set(answer.seen) <= {"b1", "b2"} and "b2" in answer.seen
    assert set(hosts(info.value.attempt_history)) <= {"b1", "b2"}
    statuses = {h.endpoint: h.status.value for h in client.stats().endpoints}
    assert statuses["b2.test:80"] != "ejected"


async def test_with_its_pool_out_a_call_fails_fast_even_beside_an_idle_pool(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host(b1=failing(), b2=failing())
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = api.client(
            base_url=fleet(),
            priority="sheddable",
            breaker=BreakerConfig(consecutive_failures=1, open_time=60.0),
            retry_policy=RetryPolicy(max_attempts=2),
        )
        for i in (1, 2):  # the interactive pool reports room: spill-over is off
            client._core.picker.observe(state_of(client, f"i{i}"), ROOM)
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
        answer.seen.clear()
        with pytest.raises(CircuitOpenError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert answer.seen == []


def spill_client(api: Api, **kwargs: Any) -> Any:
    """A batch client whose batch endpoint fails once and then has its breaker open."""
    kwargs.setdefault("spill_over", SpillOver())
    return api.client(
        base_url=[Endpoint(I1, classes=INTERACTIVE), Endpoint(B1, classes=BATCH)],
        priority="sheddable",
        breaker=BreakerConfig(consecutive_failures=1, open_time=60.0),
        retry_policy=RetryPolicy(max_attempts=3),
        **kwargs,
    )


async def test_spill_over_takes_an_interactive_replica_only_while_it_reports_headroom(
    api: Api,
) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host(b1=failing())
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = spill_client(api)
        client._core.picker.observe(state_of(client, "i1"), ROOM)
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
        # b1 failed and its breaker opened; i1 said it had room: the retry spilled.
        assert hosts(resp.attempt_history) == ["b1", "i1"]
        # Its report is 5 s old, then older: no fresh report, no headroom.
        api.clock.advance(5.1)
        with pytest.raises(CircuitOpenError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert answer.seen == ["b1", "i1"]


@pytest.mark.parametrize(
    "load",
    [
        ServerLoad(queue_depth=1, inflight_tokens=100, token_capacity=1000),
        ServerLoad(queue_depth=0, inflight_tokens=800, token_capacity=1000),
        ServerLoad(queue_depth=0, kv_cache_usage=0.8),
        ServerLoad(queue_depth=0, load_shed="queue_full"),
        ServerLoad(inflight_tokens=10, token_capacity=1000),  # no queue depth: no word on room
    ],
    ids=["queue", "tokens", "kv", "shed", "no-queue-depth"],
)
async def test_no_spill_over_without_headroom(api: Api, load: ServerLoad) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host(b1=failing())
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = spill_client(api)
        client._core.picker.observe(state_of(client, "i1"), load)
        with pytest.raises(stormguard.InternalServerError) as info:
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert hosts(info.value.attempt_history) == ["b1"]
    assert answer.seen == ["b1"]


async def test_spill_over_is_for_the_classes_it_names(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host(i1=failing())
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        # Interactive work may not spill onto the batch pool by default ...
        client = api.client(
            base_url=[Endpoint(I1, classes=INTERACTIVE), Endpoint(B1, classes=BATCH)],
            spill_over=SpillOver(),
            retry_budget=RetryBudget(ratio=1.0, min_retries_per_second=10, clock=api.clock),
            retry_policy=RetryPolicy(max_attempts=2),
        )
        client._core.picker.observe(state_of(client, "b1"), ROOM)
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
        assert answer.seen == ["i1", "i1"]
        # ... unless it is named.
        answer.seen.clear()
        both = api.client(
            base_url=[Endpoint(I1, classes=INTERACTIVE), Endpoint(B1, classes=BATCH)],
            spill_over=SpillOver(classes={"standard", "sheddable"}),
            retry_policy=RetryPolicy(max_attempts=2),
        )
        both._core.picker.observe(state_of(both, "b1"), ROOM)
        resp = await api.run(both.chat.completions.create(messages=MESSAGES))
    assert hosts(resp.attempt_history) == ["i1", "b1"]


async def test_a_spilled_call_prefers_its_own_pool_while_it_has_room(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host()
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = spill_client(api)
        client._core.picker.observe(state_of(client, "i1"), ROOM)
        for _ in range(20):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert set(answer.seen) == {"b1"}


def tracker_for(endpoints: list[Endpoint]) -> tuple[EjectionTracker, list[EndpointState]]:
    states = [EndpointState(e) for e in endpoints]
    tracker = EjectionTracker(
        EjectionConfig(probe="call"),
        states=lambda: states,
        clock=FakeClock(),
        rng=random.Random(1),
    )
    return tracker, states


def test_ejection_never_takes_the_last_endpoint_of_a_pool() -> None:
    tracker, (i1, i2, b1, b2) = tracker_for(fleet())
    assert tracker.record(b1, Evidence.UNREACHABLE)
    assert not tracker.record(b2, Evidence.UNREACHABLE)  # the last batch replica
    assert tracker.record(i1, Evidence.UNREACHABLE)
    assert not tracker.record(i2, Evidence.UNREACHABLE)  # the last interactive one
    # An untagged endpoint serves every class: a batch-only one does not cover it.
    tracker, (untagged, batch) = tracker_for([Endpoint(I1), Endpoint(B1, classes=BATCH)])
    assert not tracker.record(untagged, Evidence.UNREACHABLE)
    assert tracker.record(batch, Evidence.UNREACHABLE)
    # Per model too: b1 is the only sheddable endpoint of model "small".
    tracker, (small_batch, other_batch, _) = tracker_for(
        [
            Endpoint(B1, classes=BATCH, models={"small"}),
            Endpoint(B2, classes=BATCH, models={"large"}),
            Endpoint(I1, classes=INTERACTIVE, models={"small"}),
        ]
    )
    assert not tracker.record(small_batch, Evidence.UNREACHABLE)
    assert tracker.record(other_batch, Evidence.UNREACHABLE) is False  # "large": the last


async def test_pools_compose_with_dns_discovery(api: Api) -> None:
    addresses = {"interactive.ns.svc": ["10.0.1.1", "10.0.1.2"], "batch.ns.svc": ["10.0.2.1"]}
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.url.host} {request.headers['host']}")
        return ok(request)

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://10\.0\.\d\.\d:8000/v1/chat/completions").mock(
            side_effect=answer
        )
        client = api.client(
            base_url=[
                Endpoint("dns+http://interactive.ns.svc:8000/v1", classes=INTERACTIVE),
                Endpoint("dns+http://batch.ns.svc:8000/v1", classes=BATCH),
            ],
            discovery=DiscoveryConfig(
                resolver=lambda host, port: addresses[host], executor=lambda job: job()
            ),
        )
        for priority in ("sheddable", "standard") * 10:
            await api.run(
                client.chat.completions.create(
                    messages=MESSAGES, extra_headers={"x-priority": priority}
                )
            )
    assert {s for s in sent[::2]} == {"10.0.2.1 batch.ns.svc:8000"}
    assert {s for s in sent[1::2]} <= {
        "10.0.1.1 interactive.ns.svc:8000",
        "10.0.1.2 interactive.ns.svc:8000",
    }
    states = {s.name: s.classes for s in client._core.picker.states}
    assert states["10.0.2.1:8000"] == frozenset({Priority.SHEDDABLE})


async def test_a_class_no_endpoint_serves_is_a_clear_error(api: Api) -> None:
    with pytest.raises(ValueError, match=r"a class is an x-priority value \(critical, standard"):
        Endpoint(I1, classes={"interactive"})
    with pytest.raises(TypeError, match="not one string"):
        Endpoint(I1, classes="sheddable")
    with pytest.raises(ValueError, match="classes is empty"):
        Endpoint(I1, classes=())
    # A client whose calls (standard by default) have no pool: said when it is made.
    with pytest.raises(ValueError, match="for priority class 'standard'"):
        api.client(base_url=[Endpoint(B1, classes=BATCH)])
    with pytest.raises(ValueError, match="for priority class 'critical'"):
        api.client(base_url=[Endpoint(B1, classes=BATCH)], priority="critical")
    # A call's own class without a pool: said at the call, before any request.
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(url__regex=ANY_HOST).mock(side_effect=ok)
        client = api.client(base_url=[Endpoint(I1, classes=INTERACTIVE)])
        with pytest.raises(ValueError, match="for priority class 'sheddable'"):
            await api.run(
                client.chat.completions.create(
                    messages=MESSAGES, extra_headers={"x-priority": "sheddable"}
                )
            )
    assert not route.called
    with pytest.raises(TypeError, match="SpillOver"):
        api.client(base_url=fleet(), spill_over=True)
    with pytest.raises(ValueError, match="max_token_share"):
        SpillOver(max_token_share=1.5)
    with pytest.raises(ValueError, match="max_queue_depth"):
        SpillOver(max_queue_depth=-1)
    assert "classes=['critical', 'standard']" in repr(Endpoint(I1, classes=INTERACTIVE))
