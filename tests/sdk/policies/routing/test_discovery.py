"""DNS discovery through the client, sync and async: a stub resolver and a fake clock,
no network. Each address of a name is an endpoint; the set follows the name on a
period and on failure, within a floor; endpoints that stay keep their state."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import stormguard
from stormguard import (
    APITimeoutError,
    DiscoveryChange,
    DiscoveryConfig,
    DiscoveryError,
    Endpoint,
)
from stormguard._policies.routing.discovery import Discovery
from stormguard._policies.routing.picker import EndpointPicker
from stormguard.telemetry import Telemetry
from stormguard.testing import FakeClock
from tests.sdk.helpers import MESSAGES, Api, chat_json

SERVICE = "http://vllm.ns.svc:8000/v1"
ANY_ADDRESS = r"http://(\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]+\]):8000/v1/chat/completions"


def inline(job: Callable[[], None]) -> None:
    job()


class StubResolver:
    """Answers each look with the next of ``answers`` (the last one repeats); an
    Exception in the list is raised. Counts the looks."""

    def __init__(self, *answers: Sequence[str] | Exception) -> None:
        self.answers = list(answers)
        self.looks: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> Sequence[str]:
        self.looks.append((host, port))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def config(resolver: Any, **overrides: Any) -> DiscoveryConfig:
    return DiscoveryConfig(resolver=resolver, executor=inline, **overrides)


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=chat_json())


def seen_by(log: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return ok(request)

    return answer


def endpoints_of(client: Any) -> set[str]:
    return set(client.stats().endpoint_names)


async def test_every_address_of_the_name_is_an_endpoint_with_the_service_as_host(
    api: Api,
) -> None:
    resolver = StubResolver(["10.0.0.5", "10.0.0.6", "10.0.0.5"])
    sent: list[httpx.Request] = []
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=seen_by(sent))
        client = api.client(base_url=f"dns+{SERVICE}", discovery=config(resolver))
        for _ in range(30):
            resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resolver.looks == [("vllm.ns.svc", 8000)]
    assert endpoints_of(client) == {"10.0.0.5:8000", "10.0.0.6:8000"}
    assert {r.url.host for r in sent} == {"10.0.0.5", "10.0.0.6"}  # both take calls
    assert {r.headers["host"] for r in sent} == {"vllm.ns.svc:8000"}
    assert all("sni_hostname" not in r.extensions for r in sent)  # plain HTTP: no TLS
    assert resp.attempt_history[0].endpoint in {"10.0.0.5:8000", "10.0.0.6:8000"}
    # What the client shows is the service as given; its endpoints are in the stats.
    assert client.base_url == SERVICE
    [state] = client.stats().discovery
    assert (state.name, state.endpoints, state.looks, state.failures, state.last_error) == (
        "vllm.ns.svc:8000",
        ("10.0.0.5:8000", "10.0.0.6:8000"),
        1,
        0,
        None,
    )


async def test_discover_dns_ipv6_and_https_check_the_certificate_against_the_service(
    api: Api,
) -> None:
    resolver = StubResolver(["fd00::5", "fd00::6"])
    sent: list[httpx.Request] = []
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"https://\[fd00::[56]\]:8443/v1/chat/completions").mock(
            side_effect=seen_by(sent)
        )
        client = api.client(
            base_url="https://vllm.ns.svc:8443/v1", discover="dns", discovery=config(resolver)
        )
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert endpoints_of(client) == {"[fd00::5]:8443", "[fd00::6]:8443"}
    [request] = sent
    assert request.headers["host"] == "vllm.ns.svc:8443"
    assert request.extensions["sni_hostname"] == "vllm.ns.svc"


async def test_the_set_follows_the_name_every_period_and_endpoints_that_stay_keep_their_state(
    api: Api,
) -> None:
    resolver = StubResolver(["10.0.0.5", "10.0.0.6"], ["10.0.0.6", "10.0.0.7"])
    changes: list[DiscoveryChange] = []
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=ok)
        client = api.client(
            base_url=Endpoint(f"dns+{SERVICE}", weight=2.0, models={"m"}),
            discovery=config(resolver),
            discovery_listeners=[changes.append],
        )
        await api.run(client.chat.completions.create(messages=MESSAGES))
        picker = client._core.picker
        kept = next(s for s in picker.states if s.name == "10.0.0.6:8000")
        breaker = client._core.breakers.get("10.0.0.6:8000", "m")
        api.clock.advance(29.0)
        await api.run(client.chat.completions.create(messages=MESSAGES))
        assert len(resolver.looks) == 1  # not due yet
        api.clock.advance(1.0)
        await api.run(client.chat.completions.create(messages=MESSAGES))
        assert len(resolver.looks) == 2
    assert endpoints_of(client) == {"10.0.0.6:8000", "10.0.0.7:8000"}
    assert next(s for s in picker.states if s.name == "10.0.0.6:8000") is kept
    assert client._core.breakers.get("10.0.0.6:8000", "m") is breaker
    new = next(s for s in picker.states if s.name == "10.0.0.7:8000")
    assert (new.weight, new.models, new.in_flight) == (2.0, frozenset({"m"}), 0)
    assert [(c.added, c.removed) for c in changes] == [
        (("10.0.0.5:8000", "10.0.0.6:8000"), ()),
        (("10.0.0.7:8000",), ("10.0.0.5:8000",)),
    ]
    assert changes[-1].endpoints == ("10.0.0.6:8000", "10.0.0.7:8000")


def refuse_host(address: str) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == address:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return ok(request)

    return answer


async def test_an_unreachable_endpoint_asks_for_a_look_within_the_floor(api: Api) -> None:
    # The pod at .5 was replaced by one at .7: its address refuses connections.
    resolver = StubResolver(["10.0.0.5", "10.0.0.6"], ["10.0.0.6", "10.0.0.7"])
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=refuse_host("10.0.0.5"))
        client = api.client(base_url=f"dns+{SERVICE}", discovery=config(resolver))
        api.clock.advance(2.0)  # a look at 0 s: the floor (5 s) holds the next one
        for _ in range(20):
            resp = await api.run(client.chat.completions.create(messages=MESSAGES))
            if any(a.endpoint == "10.0.0.5:8000" for a in resp.attempt_history):
                break
        else:
            pytest.fail("no call went to 10.0.0.5")
        assert len(resolver.looks) == 1  # wanted, but within the floor
        assert "10.0.0.5:8000" in endpoints_of(client)
        api.clock.advance(3.0)  # 5 s after the last look: the next call looks
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert len(resolver.looks) == 2
    assert endpoints_of(client) == {"10.0.0.6:8000", "10.0.0.7:8000"}


async def test_every_endpoint_out_asks_for_a_look(api: Api) -> None:
    resolver = StubResolver(["10.0.0.5"], ["10.0.0.9"])

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.5":
            return httpx.Response(500, json={"error": {"message": "engine failed"}})
        return ok(request)

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=answer)
        client = api.client(
            base_url=f"dns+{SERVICE}",
            discovery=config(resolver),
            breaker=stormguard.BreakerConfig(consecutive_failures=1, open_time=60.0),
            retry_policy=stormguard.RetryPolicy(max_attempts=1),
        )
        api.clock.advance(10.0)
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
        # The failure opened the only endpoint's breaker: deciding on a retry found
        # no endpoint, which asked for a look; it found the replica that replaced it.
        assert len(resolver.looks) == 2
        assert endpoints_of(client) == {"10.0.0.9:8000"}
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.attempt_history[0].endpoint == "10.0.0.9:8000"


async def test_a_failed_or_empty_look_keeps_the_last_good_set_and_warns_once_a_streak(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    resolver = StubResolver(
        ["10.0.0.5", "10.0.0.6"],
        OSError("[Errno -3] Temporary failure in name resolution"),
        [],
        ["10.0.0.6"],
    )
    with respx.mock(assert_all_called=False) as mock, caplog.at_level(logging.INFO):
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=ok)
        client = api.client(base_url=f"dns+{SERVICE}", discovery=config(resolver))
        for _ in range(2):  # the failure, then the empty answer
            api.clock.advance(30.0)
            await api.run(client.chat.completions.create(messages=MESSAGES))
            assert endpoints_of(client) == {"10.0.0.5:8000", "10.0.0.6:8000"}
        [state] = client.stats().discovery
        assert (state.looks, state.failures) == (3, 2)
        assert state.last_error == "the name resolved to no address"
        api.clock.advance(4.0)  # a failing name is looked at again after the floor, not 30 s
        await api.run(client.chat.completions.create(messages=MESSAGES))
        assert len(resolver.looks) == 3
        api.clock.advance(1.0)
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert len(resolver.looks) == 4
    assert endpoints_of(client) == {"10.0.0.6:8000"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "DNS discovery of vllm.ns.svc:8000 failed (OSError: [Errno -3] Temporary failure in"
        " name resolution); keeping its last 2 endpoints"
    ]
    assert any("answers again" in r.getMessage() for r in caplog.records)


async def test_a_first_look_that_fails_is_a_clear_error_at_the_first_call(api: Api) -> None:
    resolver = StubResolver(OSError("[Errno -2] Name or service not known"), ["10.0.0.5"])
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(url__regex=ANY_ADDRESS).mock(side_effect=ok)
        client = api.client(base_url=f"dns+{SERVICE}", discovery=config(resolver))
        with pytest.raises(DiscoveryError) as caught:
            await api.run(client.chat.completions.create(messages=MESSAGES))
        assert str(caught.value) == (
            "DNS discovery of vllm.ns.svc:8000 found no address: OSError: [Errno -2] Name or"
            " service not known; the next look may start in 5.0s"
        )
        assert caught.value.attempts == 0 and not route.called
        api.clock.advance(5.0)
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.attempt_history[0].endpoint == "10.0.0.5:8000"


async def test_the_first_call_waits_for_the_first_look_off_the_event_loop(api: Api) -> None:
    """The default executor: a thread. The call waits for it; an event loop runs on."""
    entered, release = threading.Event(), threading.Event()

    def slow(host: str, port: int) -> list[str]:
        entered.set()
        release.wait(10)
        return ["10.0.0.5"]

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=ok)
        client = api.client(base_url=f"dns+{SERVICE}", discovery=DiscoveryConfig(resolver=slow))
        assert entered.wait(10)
        ticks = 0

        async def ticker() -> None:
            # Ticks while the call waits for the look, and lets the look end after three.
            nonlocal ticks
            while not release.is_set():
                ticks += 1
                if ticks >= 3:
                    release.set()
                await asyncio.sleep(0.01)

        if api.mode == "sync":

            def release_soon() -> None:
                time.sleep(0.05)  # the call is most likely waiting by then; either way works
                release.set()

            threading.Thread(target=release_soon).start()
            resp = client.chat.completions.create(messages=MESSAGES)
        else:
            resp, _ = await asyncio.gather(
                client.chat.completions.create(messages=MESSAGES), ticker()
            )
            assert ticks >= 3  # the loop ran while the call waited for the look
    assert resp.attempt_history[0].endpoint == "10.0.0.5:8000"


async def test_a_first_look_that_hangs_ends_the_call_at_its_deadline(mode: str) -> None:
    release = threading.Event()

    def hung(host: str, port: int) -> list[str]:
        release.wait(30)
        return ["10.0.0.5"]

    cls = stormguard.Client if mode == "sync" else stormguard.AsyncClient
    client: Any = cls(
        base_url=f"dns+{SERVICE}", model="m", discovery=DiscoveryConfig(resolver=hung)
    )
    started = time.monotonic()
    try:
        with pytest.raises(APITimeoutError, match="deadline passed while resolving vllm"):
            call = client.chat.completions.create(messages=MESSAGES, timeout=0.3)
            if mode == "async":
                await call
        assert time.monotonic() - started < 0.3 + 1.5
    finally:
        release.set()
        closed = client.close()
        if mode == "async":
            await closed


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_hung_look_is_given_company_once_and_a_late_answer_changes_nothing() -> None:
    clock = FakeClock()
    jobs: list[Callable[[], None]] = []
    answers = iter([["10.0.0.5"], ["10.0.0.6"]])
    picker = EndpointPicker([], clock=clock, rng=random.Random(1), discovered=True)
    discovery = Discovery(
        [(Endpoint(SERVICE), True)],
        picker=picker,
        config=DiscoveryConfig(resolver=lambda h, p: next(answers), executor=jobs.append),
        clock=clock,
    )
    discovery.start()
    assert len(jobs) == 1
    clock.advance(9.0)
    discovery.request_refresh()
    assert len(jobs) == 1  # one look at a time while it may still answer
    clock.advance(1.0)
    discovery.request_refresh()
    assert len(jobs) == 2  # the first is overdue: another starts
    clock.advance(30.0)
    discovery.request_refresh()
    assert len(jobs) == 2  # two hung looks: no third thread
    jobs[1]()  # the second answers first ...
    assert [s.name for s in picker.states] == ["10.0.0.5:8000"]
    jobs[0]()  # ... and the first, late, is older: ignored
    assert [s.name for s in picker.states] == ["10.0.0.5:8000"]


async def test_answers_that_are_not_addresses_are_left_out_and_the_count_is_capped(
    api: Api,
) -> None:
    resolver = StubResolver(["10.0.0.5", "not-an-ip", "10.0.0.6", "10.0.0.7"])
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=ok)
        client = api.client(base_url=f"dns+{SERVICE}", discovery=config(resolver, max_addresses=2))
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert endpoints_of(client) == {"10.0.0.5:8000", "10.0.0.6:8000"}


class CountedAnswers:
    """A resolver's answer that counts how many of its entries were read."""

    def __init__(self, entries: list[str]) -> None:
        self.entries = entries
        self.read = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> str:
        return self.entries[index]

    def __iter__(self) -> Any:
        for entry in self.entries:
            self.read += 1
            yield entry


def test_a_huge_answer_is_read_only_up_to_the_cap_each_address_once() -> None:
    # 32,768 distinct addresses: deduplicated in a list, 9 s of CPU before the cap
    # applied. Now the look stops reading once it has max_addresses of them.
    from stormguard._policies.routing.discovery_endpoints import valid_addresses
    from stormguard._policies.routing.dns_name import NameState

    name = NameState(Endpoint(SERVICE))
    many = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(32_768)]
    answer = CountedAnswers(["10.0.0.1", "junk", "10.0.0.1", *many])
    kept = valid_addresses(name, answer, 256)  # type: ignore[arg-type]
    assert kept[:2] == ["10.0.0.1", "10.0.0.0"] and len(kept) == len(set(kept)) == 256
    assert answer.read <= 256 + 3
    # Duplicates alone: read to the end, once each, in linear time.
    repeated = ["10.0.0.7", "::1", "10.0.0.7", "0:0::1"] * 5_000
    started = time.process_time()
    assert valid_addresses(name, repeated, 256) == ["10.0.0.7", "::1"]
    assert time.process_time() - started < 5.0  # about 0.05 s: linear
    wide = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(20_000)]
    started = time.process_time()
    assert len(valid_addresses(name, wide, 100_000)) == 20_000  # a cap set very high
    assert time.process_time() - started < 5.0  # about 0.05 s; a list's `in` took ~4 s


async def test_a_call_in_flight_to_an_address_that_left_finishes_normally(api: Api) -> None:
    resolver = StubResolver(["10.0.0.5"], ["10.0.0.6"])
    client: Any = None

    def answer(request: httpx.Request) -> httpx.Response:
        # While this attempt is in flight, the name moves to another address.
        api.clock.advance(30.0)
        client._core.discovery.request_refresh()
        assert endpoints_of(client) == {"10.0.0.6:8000"}
        return ok(request)

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=answer)
        client = api.client(base_url=f"dns+{SERVICE}", discovery=config(resolver))
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.choices[0].message.content == "hello"
    assert [(a.endpoint, a.outcome) for a in resp.attempt_history] == [("10.0.0.5:8000", "ok")]


async def test_static_and_discovered_endpoints_together(api: Api) -> None:
    resolver = StubResolver(["10.0.0.5"])
    sent: list[httpx.Request] = []
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=seen_by(sent))
        mock.post("http://static.test/v1/chat/completions").mock(side_effect=seen_by(sent))
        client = api.client(
            base_url=["http://static.test/v1", Endpoint(f"dns+{SERVICE}", name="pool")],
            discovery=config(resolver),
        )
        for _ in range(20):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert endpoints_of(client) == {"static.test:80", "pool/10.0.0.5:8000"}
    assert {r.headers["host"] for r in sent} == {"static.test", "vllm.ns.svc:8000"}


async def test_a_change_of_the_set_is_a_metric_and_errors_carry_no_secret(api: Api) -> None:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    resolver = StubResolver(["10.0.0.5", "10.0.0.6"], OSError("lookup sk-test-secret-key"))
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_ADDRESS).mock(side_effect=ok)
        client = api.client(
            base_url=f"dns+{SERVICE}",
            discovery=config(resolver),
            telemetry=Telemetry(meter_provider=meter_provider),
        )
        api.clock.advance(30.0)
        await api.run(client.chat.completions.create(messages=MESSAGES))
    [state] = client.stats().discovery
    assert state.last_error is not None and "sk-test-secret-key" not in state.last_error
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    [count] = points["stormguard.client.discovery.endpoints"]
    assert (count.attributes["stormguard.discovery.name"], count.value) == ("vllm.ns.svc:8000", 2)
    [changes] = points["stormguard.client.discovery.changes"]
    assert changes.value == 1
    meter_provider.shutdown()


def test_bad_discovery_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match='discover must be "dns"'):
        stormguard.Client(base_url=SERVICE, discover="srv")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DiscoveryConfig"):
        stormguard.Client(base_url=SERVICE, discover="dns", discovery={"resolver": None})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_refresh_interval must not exceed"):
        DiscoveryConfig(refresh_interval=2.0)
    with pytest.raises(ValueError, match="refresh_interval must be a positive"):
        DiscoveryConfig(refresh_interval=0)
    with pytest.raises(ValueError, match="max_addresses"):
        DiscoveryConfig(max_addresses=0)
    with pytest.raises(ValueError, match="base_url must be an http"):
        stormguard.Client(base_url="dns+ftp://vllm.ns.svc/v1")


def test_doctests() -> None:
    import doctest

    import stormguard._policies.routing.discovery
    import stormguard._policies.routing.picker

    assert doctest.testmod(stormguard._policies.routing.discovery).failed == 0
    assert doctest.testmod(stormguard._policies.routing.picker).failed == 0
