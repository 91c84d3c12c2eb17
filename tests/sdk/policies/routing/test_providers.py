"""Several providers behind one client: ``Deployment`` (its own credential, model
names, query and tier) and failover by tier, sync and async, on a fake clock.

Three deployments of one logical model ("chat-large"): OpenAI (tier 1), Azure
OpenAI (tier 2, its key in ``api-key``, an ``api-version`` query, a deployment
name) and a self-hosted vLLM (tier 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard import (
    BreakerConfig,
    ConcurrencyLimiter,
    Deployment,
    EjectionConfig,
    Pin,
    RetryBudget,
    RetryPolicy,
    StreamTimeouts,
)
from stormguard.telemetry import Telemetry
from tests.sdk.call.test_stream_timeouts import DONE, event, streaming
from tests.sdk.helpers import MESSAGES, Api, chat_json, unreachable
from tests.sdk.policies.routing.test_failover import _until

OPENAI, AZURE, VLLM = (
    "http://openai.test/v1",
    "http://azure.test/openai/v1",
    "http://vllm.test/v1",
)
OPENAI_KEY = "sk-openai-0123456789abcdef"
AZURE_KEY = "azure-key-0123456789abcdef"
VLLM_KEY = "vllm-token-0123456789abcdef"
CLIENT_KEY = "sk-test-secret-key"  # the Api helper's: never sent to a deployment
ANY = r"http://(openai|azure|vllm|backup)\.test(:\d+)?/.*"


def deployments(*, vllm: bool = True, **changes: Any) -> list[Deployment]:
    found = [
        Deployment(
            OPENAI, name="openai", models={"chat-large": "gpt-4.1"}, api_key=OPENAI_KEY, **changes
        ),
        Deployment(
            AZURE,
            name="azure",
            tier=2,
            models={"chat-large": "prod-gpt41"},
            api_key=AZURE_KEY,
            api_key_header="api-key",
            query={"api-version": "preview"},
            **changes,
        ),
    ]
    if vllm:
        found.append(
            Deployment(
                VLLM,
                name="vllm",
                tier=3,
                models={"chat-large": "meta-llama/Llama-3.3-70B-Instruct"},
                api_key=VLLM_KEY,
                **changes,
            )
        )
    return found


class Providers:
    """A respx side effect that answers each provider its own way and records what
    each request carried."""

    def __init__(self, **answers: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, httpx.Request, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        name = request.url.host.split(".")[0]
        self.seen.append((name, request, json.loads(request.content or b"{}")))
        answer = self.answers.get(name, ok)
        return answer(request)

    def hosts(self) -> list[str]:
        return [name for name, _, _ in self.seen]


def ok(request: httpx.Request | None = None) -> httpx.Response:
    model = json.loads(request.content)["model"] if request is not None else "m"
    return httpx.Response(200, json=chat_json(model=f"{model}-2025-04-14"))


def failing(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "engine failed"}})


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def out_of_quota(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        429,
        json={
            "error": {
                "message": "You exceeded your current quota",
                "type": "insufficient_quota",
                "code": "insufficient_quota",
            }
        },
    )


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        yield mock


def client_of(api: Api, **kwargs: Any) -> Any:
    kwargs.setdefault("base_url", deployments())
    kwargs.setdefault("model", "chat-large")
    return api.client(**kwargs)


async def chat(api: Api, client: Any, **kwargs: Any) -> Any:
    return await api.run(client.chat.completions.create(messages=MESSAGES, **kwargs))


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"tier": 0}, "tier must be an integer >= 1"),
        ({"tier": True}, "tier must be an integer >= 1"),
        ({"tier": 1.5}, "tier must be an integer >= 1"),
        ({"models": {"chat-large": ""}}, "'chat-large' is mapped to nothing"),
        ({"models": {"chat-large": None}}, "'chat-large' is mapped to nothing"),
        ({"models": {}}, "models is empty"),
        ({"api_key": "k" * 12, "api_key_env": "KEY"}, "not both"),
        ({"api_key": ""}, "api_key must be a non-empty string"),
        ({"api_key": "k" * 12, "headers": {"Authorization": "x"}}, "headers gives"),
        ({"headers": {"x-team": "a\r\nb"}}, "line break"),
        ({"query": {"api-version": ""}}, "query parameter 'api-version'"),
    ],
)
def test_bad_configuration_is_a_clear_error_when_made(changes: dict[str, Any], error: str) -> None:
    fields: dict[str, Any] = {"name": "x", "models": ["chat-large"], **changes}
    with pytest.raises(ValueError, match=error):
        Deployment(OPENAI, **fields)


def test_two_deployments_with_one_name_are_refused_when_the_client_is_made() -> None:
    twice = [Deployment(OPENAI, name="p"), Deployment(AZURE, name="p", tier=2)]
    with pytest.raises(ValueError, match="endpoint names must be unique"):
        stormguard.Client(base_url=twice, model="m")
    same_host = [Deployment(AZURE), Deployment(AZURE + "/x", tier=2)]  # host:port twice
    with pytest.raises(ValueError, match="give each Endpoint or Deployment"):
        stormguard.Client(base_url=same_host, model="m")


def test_a_key_is_read_from_the_environment_once_and_a_missing_one_is_named(
    monkeypatch: pytest.MonkeyPatch, router: respx.MockRouter
) -> None:
    named = Deployment(OPENAI, name="openai", api_key_env="SG_TEST_OPENAI_KEY")
    monkeypatch.delenv("SG_TEST_OPENAI_KEY", raising=False)
    with pytest.raises(ValueError, match=r"SG_TEST_OPENAI_KEY.*is not set"):
        stormguard.Client(base_url=[named], model="m")
    monkeypatch.setenv("SG_TEST_OPENAI_KEY", OPENAI_KEY)
    route = router.post(f"{OPENAI}/chat/completions").mock(return_value=ok())
    with stormguard.Client(base_url=[named], model="m") as client:
        monkeypatch.setenv("SG_TEST_OPENAI_KEY", "sk-changed-later-0123456789")
        client.chat.completions.create(messages=MESSAGES)
    assert route.calls.last.request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "SG_TEST_OPENAI_KEY" in repr(named) and OPENAI_KEY not in repr(client._core.endpoints)


def test_a_pin_names_one_tier_or_one_deployment_the_client_has() -> None:
    for bad in ({}, {"tier": 1, "deployment": "a"}, {"tier": 0}, {"deployment": ""}):
        with pytest.raises(ValueError):
            Pin(**bad)
    with stormguard.Client(base_url=deployments(), model="chat-large") as client:
        with pytest.raises(ValueError, match="no endpoint of this client is named 'nope'"):
            client.chat.completions.create(messages=MESSAGES, pin=Pin(deployment="nope"))
        with pytest.raises(ValueError, match="no endpoint of this client is of tier 4"):
            client.chat.completions.create(messages=MESSAGES, pin=Pin(tier=4))
        with pytest.raises(ValueError, match="x-stormguard-tier must be a tier number"):
            client.chat.completions.create(
                messages=MESSAGES, extra_headers={"x-stormguard-tier": "first"}
            )
        with pytest.raises(TypeError, match=r"pin must be a stormguard\.Pin"):
            client.chat.completions.create(messages=MESSAGES, pin=2)  # type: ignore[arg-type]


# -- what an attempt sends -------------------------------------------------------------


async def test_each_attempt_sends_its_deployments_key_model_name_and_query(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(openai=failing)
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api, default_headers={"x-team": "search", "OpenAI-Organization": "org-1"})
    resp = await chat(api, client, extra_headers={"Authorization": "Bearer sk-call-own-0123456789"})
    (_, first, first_body), (_, second, second_body) = providers.seen
    assert providers.hosts() == ["openai", "azure"]
    assert first.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert first_body["model"] == "gpt-4.1" and first.url.query == b""
    assert second.headers["api-key"] == AZURE_KEY and "authorization" not in second.headers
    assert second_body["model"] == "prod-gpt41"
    assert second.url.path == "/openai/v1/chat/completions"
    assert second.url.params["api-version"] == "preview"
    for _, request, _ in providers.seen:
        # Another provider's account never travels: not the client's key, not its
        # organization, not the call's own credential; the rest of its headers do.
        assert CLIENT_KEY not in str(request.headers) and "sk-call-own" not in str(request.headers)
        assert "openai-organization" not in request.headers
        assert request.headers["x-team"] == "search"
    # The answer is the provider's: its model as it sent it; the call's is the logical one.
    assert resp.model == "prod-gpt41-2025-04-14" and resp.served_model == "chat-large"
    assert (resp.call_info.deployment, resp.call_info.tier) == ("azure", 2)


async def test_a_calls_query_wins_over_a_deployments_default(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers()
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api, base_url=deployments()[1:2])
    await chat(api, client, extra_query={"api-version": "2024-10-21", "x": "1"})
    [(_, request, _)] = providers.seen
    assert request.url.params.get_list("api-version") == ["2024-10-21"]
    assert request.url.params["x"] == "1"


# -- which tier ------------------------------------------------------------------------


async def test_calls_go_to_the_best_tier_while_it_takes_them(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers()
    router.post(url__regex=ANY).mock(side_effect=providers)
    second_openai = Deployment(
        "http://openai.test:81/v1", name="openai-b", models={"chat-large": "gpt-4.1"}
    )
    client = client_of(api, base_url=[*deployments(), second_openai])
    for _ in range(20):
        resp = await chat(api, client)
        assert resp.call_info.tier == 1
    assert set(providers.hosts()) == {"openai"}
    served = {d.deployment: d for d in client.stats().deployments}
    assert served["openai"].served + served["openai-b"].served == 20
    assert all(d.tier == 1 for d in served.values())


@pytest.mark.parametrize("reason", ["unreachable", "consecutive_failures", "out_of_quota"])
async def test_a_tier_is_left_when_its_deployments_leave_rotation(
    api: Api, router: respx.MockRouter, reason: str
) -> None:
    """Refused connections, failures in a row, an account out of credit: each ejects
    OpenAI; the failing calls fail over to Azure at once, without the retry budget,
    and the next calls go there without trying OpenAI."""
    answer = {"unreachable": refused, "consecutive_failures": failing}.get(reason, out_of_quota)
    providers = Providers(openai=answer)
    router.post(url__regex=ANY).mock(side_effect=providers)
    budget = RetryBudget(ratio=0.0, min_retries_per_second=0.0, clock=api.clock)
    client = client_of(api, retry_budget=budget)
    for _ in range(6):
        resp = await chat(api, client)
        assert resp.call_info.deployment == "azure"
    openai_attempts = 1 if reason != "consecutive_failures" else 5
    assert providers.hosts().count("openai") == openai_attempts
    assert providers.hosts().count("azure") == 6
    health = {h.endpoint: h for h in client.stats().endpoints}
    assert health["openai"].status == "ejected" and health["openai"].reason == reason
    assert client.stats().retries_refused_by_budget == 0
    assert client.stats().failovers == openai_attempts


async def test_a_tier_whose_breaker_is_open_is_left(api: Api, router: respx.MockRouter) -> None:
    providers = Providers(openai=failing)
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api, ejection=None, breaker=BreakerConfig(consecutive_failures=3))
    for _ in range(6):
        assert (await chat(api, client)).call_info.deployment == "azure"
    assert providers.hosts().count("openai") == 3
    assert client.stats().tiers_left == (("chat-large", 1),)


async def test_a_deployment_failing_half_its_calls_leaves_by_its_failure_rate(
    api: Api, router: respx.MockRouter
) -> None:
    """Failures that never come five in a row: the success-rate rule has no peer to
    compare with (Azure takes no calls while OpenAI does); the failure rate ejects."""
    count = 0

    def every_other(request: httpx.Request) -> httpx.Response:
        nonlocal count
        count += 1
        return failing(request) if count % 2 else ok(request)

    providers = Providers(openai=every_other)
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api)
    for _ in range(14):  # 11 attempts at OpenAI: 6 of them failed
        await chat(api, client)
    health = {h.endpoint: h for h in client.stats().endpoints}
    assert health["openai"].reason == "failure_rate"
    assert providers.hosts().count("openai") == 11
    assert providers.hosts()[-3:] == ["azure"] * 3


async def test_late_first_chunks_leave_a_tier_and_fail_over_within_the_call(
    api: Api, router: respx.MockRouter
) -> None:
    """OpenAI degraded: its first chunks come past the stream's first_chunk bound.
    Each call moves to Azure at the bound; five such attempts eject OpenAI."""
    slow = [(6.0, event("late")), (0.0, DONE)]
    fast = [(0.2, event("hi")), (0.0, DONE)]
    providers = Providers(
        openai=lambda request: streaming(api.clock, slow),
        azure=lambda request: streaming(api.clock, fast),
    )
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api, stream_timeouts=StreamTimeouts(first_chunk=2))
    for _ in range(8):
        stream = await chat(api, client, stream=True)
        assert [c.choices[0].delta.content for c in await api.collect(stream)] == ["hi"]
        assert stream.call_info.deployment == "azure"
    assert providers.hosts().count("openai") == 5
    assert {h.endpoint: h.reason for h in client.stats().endpoints}["openai"] == (
        "consecutive_failures"
    )


async def test_a_quota_wait_the_deadline_cannot_meet_moves_the_call_to_the_next_tier(
    api: Api, router: respx.MockRouter
) -> None:
    """OpenAI's key is rate limited for 30 s; a call with 10 s left does not wait for
    it (nor fail with QuotaWaitError): Azure's key has room."""

    def limited(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429,
            headers={"retry-after": "30"},
            json={"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
        )

    providers = Providers(openai=limited)
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api, timeout=10.0)
    first = await chat(api, client)
    second = await chat(api, client)
    assert providers.hosts() == ["openai", "azure", "azure"]
    assert [(a.deployment, a.outcome) for a in first.attempt_history] == [
        ("openai", "paced"),
        ("azure", "ok"),
    ]
    assert [a.deployment for a in second.attempt_history] == ["azure"]
    # Each deployment's key is its own: its credential, its host, its model name.
    keys = {(q.host, q.model) for q in client.stats().quota}
    assert ("openai.test", "gpt-4.1") in keys


async def test_failover_is_bounded_by_the_calls_attempts_not_paid_by_the_budget(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(openai=failing, azure=failing, vllm=failing)
    router.post(url__regex=ANY).mock(side_effect=providers)
    budget = RetryBudget(ratio=0.0, min_retries_per_second=0.0, clock=api.clock)
    fourth = Deployment("http://backup.test/v1", name="backup", tier=4, models=["chat-large"])
    client = client_of(
        api, base_url=[*deployments(), fourth], retry_budget=budget, retry_policy=RetryPolicy()
    )
    with pytest.raises(stormguard.InternalServerError) as info:
        await chat(api, client)
    error = info.value
    assert [(a.deployment, a.tier) for a in error.attempt_history] == [
        ("openai", 1),
        ("azure", 2),
        ("vllm", 3),
    ]
    assert [a.outcome for a in error.attempt_history] == ["failover", "failover", "max_attempts"]
    assert budget.state().retries == 0


# -- pinning -----------------------------------------------------------------------------


async def test_a_pinned_call_goes_only_to_its_tier_or_deployment(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(openai=refused)
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api)
    assert (await chat(api, client, pin=Pin(tier=3))).call_info.deployment == "vllm"
    header = await chat(api, client, extra_headers={"X-Stormguard-Deployment": "azure"})
    assert header.call_info.deployment == "azure"
    with pytest.raises(stormguard.APIConnectionError) as info:
        await chat(api, client, pin=Pin(deployment="openai"))
    assert [a.deployment for a in info.value.attempt_history] == ["openai"]
    # openai is out now: a call pinned to it fails at once, sending nothing elsewhere.
    with pytest.raises(stormguard.CircuitOpenError):
        await chat(api, client, pin=Pin(tier=1))
    assert providers.hosts() == ["vllm", "azure", "openai"]
    for _, request, _ in providers.seen:  # the pin is the client's: never sent
        assert {"x-stormguard-tier", "x-stormguard-deployment"}.isdisjoint(request.headers)


# -- the return --------------------------------------------------------------------------


async def test_traffic_returns_to_a_recovered_tier_as_its_limit_ramps_up(
    api: Api, router: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenAI refuses connections, is ejected, and comes back (its connect check
    passes once the outage is over). It takes one stream at first (its limit starts
    from the floor); what it cannot take goes to Azure; each stream it serves adds a
    slot, so it soon takes them all again. One log line when the tier is left, one
    when calls return."""
    down = True
    fast = [(0.1, event("hi")), (0.0, DONE)]

    def openai(request: httpx.Request) -> httpx.Response:
        return refused(request) if down else streaming(api.clock, fast)

    providers = Providers(openai=openai, azure=lambda request: streaming(api.clock, fast))
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(
        api,
        concurrency=ConcurrencyLimiter(clock=api.clock),
        ejection=EjectionConfig(probe="call"),  # the first call after the backoff probes
    )
    caplog.set_level(logging.INFO, logger="stormguard")
    await api.collect(await chat(api, client, stream=True))  # ejects OpenAI, served by Azure
    down = False
    api.clock.advance(2.0)  # past the connect check's backoff: OpenAI is back, on probation
    held = [await chat(api, client, stream=True) for _ in range(3)]
    assert [s.call_info.deployment for s in held] == ["openai", "azure", "azure"]
    for stream in held:
        await api.collect(stream)
    rounds = []
    for _ in range(3):
        held = [await chat(api, client, stream=True) for _ in range(3)]
        rounds.append([s.call_info.deployment for s in held].count("openai"))
        for stream in held:
            await api.collect(stream)
    assert rounds[0] == 2 and rounds[-1] == 3  # 1 slot, then 2, then all three
    lines = [r.getMessage() for r in caplog.records if "tier 1" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith("tier 1 left for model chat-large: openai ejected (unreachable)")
    assert lines[0].endswith("calls go to tier 2")
    assert lines[1].startswith("tier 1 back in rotation for model chat-large")
    assert client.stats().tiers_left == ()


# -- what the caller sees ----------------------------------------------------------------


async def test_spans_and_metrics_say_which_deployment_and_tier(
    api: Api, router: respx.MockRouter
) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    router.post(url__regex=ANY).mock(side_effect=Providers(openai=failing))
    client = client_of(api, telemetry=telemetry)
    await chat(api, client)
    spans = exporter.get_finished_spans()
    attempts = [s for s in spans if s.name.startswith("POST")]
    assert [(s.attributes["stormguard.deployment"], s.attributes["stormguard.tier"]) for s in
            attempts] == [("openai", 1), ("azure", 2)]  # fmt: skip
    [call] = [s for s in spans if s.name == "chat chat-large"]
    assert call.attributes["stormguard.deployment"] == "azure"
    assert call.attributes["stormguard.tier"] == 2
    data = reader.get_metrics_data()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "stormguard.client.attempts"
        for point in metric.data.data_points
    ]
    by = {
        (p.attributes["stormguard.deployment"], p.attributes["stormguard.attempt.outcome"]): p.value
        for p in points
    }
    assert by == {("openai", "failover"): 1, ("azure", "ok"): 1}


async def test_every_deployments_key_is_scrubbed_from_errors_logs_and_spans(
    api: Api, router: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """Azure echoes its own key and OpenAI's (one provider's key, seen by another);
    OpenAI echoes its own. None of them shows anywhere the client shows text."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))

    def echo(*keys: str) -> Callable[[httpx.Request], httpx.Response]:
        def answer(request: httpx.Request) -> httpx.Response:
            text = " ".join(f"bad key {key}" for key in keys)
            return httpx.Response(
                500, headers={"x-load-shed": keys[0]}, json={"error": {"message": text}}
            )

        return answer

    router.post(url__regex=ANY).mock(
        side_effect=Providers(
            openai=echo(OPENAI_KEY), azure=echo(AZURE_KEY, OPENAI_KEY), vllm=echo(VLLM_KEY)
        )
    )
    caplog.set_level(logging.DEBUG, logger="stormguard")
    client = client_of(api, telemetry=Telemetry(tracer_provider=tracer_provider))
    with pytest.raises(stormguard.InternalServerError) as info:
        await chat(api, client)
    error = info.value
    shown = [
        str(error),
        repr(error),
        json.dumps(error.body),
        repr(client),
        repr(client._core.endpoints),
        *(r.getMessage() for r in caplog.records),
    ]
    for span in exporter.get_finished_spans():
        shown += [str(v) for v in span.attributes.values()]
        shown.append(span.status.description or "")
        shown += [str(e.attributes) for e in span.events]
    assert "[redacted]" in str(error)
    for key in (OPENAI_KEY, AZURE_KEY, VLLM_KEY):
        assert not any(key in text for text in shown), key


# -- openai-python over the transport -----------------------------------------------------


async def test_openai_python_over_the_transport_fails_over_with_each_deployments_key(
    router: respx.MockRouter,
) -> None:
    openai = pytest.importorskip("openai")
    providers = Providers(openai=failing)
    router.post(url__regex=ANY).mock(side_effect=providers)
    http_client = stormguard.httpx_client(base_url=deployments(), model="chat-large")
    with openai.OpenAI(
        base_url=OPENAI, api_key="sk-openai-python-own-0123", http_client=http_client, max_retries=0
    ) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="chat-large", messages=MESSAGES, extra_headers={"x-stormguard-tier": "2"}
        )
        pinned = raw.http_response.extensions["stormguard"]
        resp = client.chat.completions.with_raw_response.create(
            model="chat-large", messages=MESSAGES
        )
        info = resp.http_response.extensions["stormguard"]
    assert (pinned.deployment, pinned.tier) == ("azure", 2)
    assert [(a.deployment, a.outcome) for a in info.attempt_history] == [
        ("openai", "failover"),
        ("azure", "ok"),
    ]
    assert resp.parse().model == "prod-gpt41-2025-04-14"
    for name, request, body in providers.seen:
        assert "sk-openai-python-own" not in str(request.headers)
        assert "x-stormguard-tier" not in request.headers
        assert body["model"] == {"openai": "gpt-4.1", "azure": "prod-gpt41"}[name]
    [first_openai] = [request for name, request, _ in providers.seen if name == "openai"]
    assert first_openai.headers["authorization"] == f"Bearer {OPENAI_KEY}"


# -- the rules that only deployments with a later tier meet ---------------------------


def test_the_failure_rate_is_a_share_in_0_1_or_none() -> None:
    assert EjectionConfig().failure_rate == 0.5 and EjectionConfig(failure_rate=None)
    for bad in (0, 1.5, True, float("nan")):
        with pytest.raises(ValueError, match="failure_rate must be in"):
            EjectionConfig(failure_rate=bad)


async def test_plain_endpoints_failing_half_their_calls_are_not_ejected_by_the_failure_rate(
    api: Api, router: respx.MockRouter
) -> None:
    """Without a later tier to go to, the failure-rate rule does not apply: two plain
    endpoints failing every other call keep serving (the success-rate rule compares
    them with each other, as before)."""
    counts: dict[str, int] = {}

    def every_other(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        counts[host] = counts.get(host, 0) + 1
        return failing(request) if counts[host] % 2 else ok(request)

    router.post(url__regex=ANY).mock(side_effect=every_other)
    client = api.client(
        base_url=[OPENAI, "http://vllm.test/v1"],
        retry_policy=RetryPolicy(max_attempts=1),
        ejection=EjectionConfig(probe=unreachable, consecutive_failures=None),
    )
    for _ in range(40):
        with contextlib.suppress(stormguard.InternalServerError):
            await chat(api, client)
    assert {h.status for h in client.stats().endpoints} == {"active"}
    assert sum(counts.values()) == 40 and min(counts.values()) >= 10


async def test_a_pin_that_leaves_no_endpoint_of_the_model_is_a_clear_error(
    api: Api, router: respx.MockRouter
) -> None:
    router.post(url__regex=ANY).mock(side_effect=Providers())
    both = {"chat-large": "gpt-4.1", "chat-small": "gpt-4.1-mini"}
    client = client_of(
        api, base_url=[Deployment(OPENAI, name="openai", models=both), deployments()[2]]
    )
    with pytest.raises(ValueError, match="no endpoint pinned to deployment 'vllm' serves"):
        await chat(api, client, model="chat-small", pin=Pin(deployment="vllm"))
    assert (await chat(api, client, model="chat-small")).call_info.deployment == "openai"


async def test_a_deployment_passed_over_for_one_models_quota_serves_the_fallback_model(
    api: Api, router: respx.MockRouter
) -> None:
    """OpenAI's quota for chat-large cannot take the call in time, and Azure fails
    it: the call falls back to chat-small, whose quota at OpenAI is another key's
    (OpenAI's limits are per model), so OpenAI serves it."""

    def openai(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["model"] == "gpt-4.1":
            return httpx.Response(
                429,
                headers={"retry-after": "30"},
                json={"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
            )
        return ok(request)

    providers = Providers(openai=openai, azure=failing)
    router.post(url__regex=ANY).mock(side_effect=providers)
    both = [
        Deployment(
            OPENAI,
            name="openai",
            models={"chat-large": "gpt-4.1", "chat-small": "gpt-4.1-mini"},
            api_key=OPENAI_KEY,
        ),
        Deployment(
            AZURE,
            name="azure",
            tier=2,
            models={"chat-large": "prod-gpt41", "chat-small": "prod-gpt41-mini"},
            api_key=AZURE_KEY,
        ),
    ]
    client = client_of(api, base_url=both, fallback_models=["chat-small"], timeout=10.0)
    resp = await chat(api, client)
    assert resp.served_model == "chat-small" and resp.call_info.deployment == "openai"
    assert [body["model"] for _, _, body in providers.seen][-1] == "gpt-4.1-mini"


async def test_a_healthy_tier_that_is_full_keeps_its_calls_in_its_queue(
    router: respx.MockRouter,
) -> None:
    """Only a tier ramping back up sends what it cannot take to the next tier: a
    healthy one at its limit queues the call locally, as one provider would."""
    api = Api("async")
    fast = [(0.1, event("hi")), (0.0, DONE)]
    providers = Providers(
        openai=lambda request: streaming(api.clock, fast),
        azure=lambda request: streaming(api.clock, fast),
    )
    router.post(url__regex=ANY).mock(side_effect=providers)
    limiter = ConcurrencyLimiter(initial_limit=1, clock=api.clock)
    client = client_of(api, concurrency=limiter)
    try:
        held = await chat(api, client, stream=True)  # OpenAI's one slot
        waiting = asyncio.create_task(chat(api, client, stream=True))
        await _until(lambda: limiter.endpoint("openai").state().waiting == 1)
        assert providers.hosts() == ["openai"]
        await api.collect(held)  # gives the slot back: the queued call takes it
        second = await waiting
        await api.collect(second)
        assert second.call_info.deployment == "openai"
        assert providers.hosts() == ["openai", "openai"]
    finally:
        await api.close_all()
