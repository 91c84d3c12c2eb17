"""No single answer poisons shared state: whatever one response says (its status,
Retry-After, ``x-ratelimit-*`` and load headers, its usage), later calls are
slowed at most by the documented bounds, and calls to another endpoint are never
stopped. A fake transport (respx) and a fake clock: nothing here waits."""

from __future__ import annotations

import email.utils
import json
from typing import Any

import httpx
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import stormguard
from stormguard._policies.limiter.aimd import MAX_PAUSE_S
from stormguard.telemetry import Telemetry
from stormguard.telemetry._metrics import MAX_SERIES, ClientMetrics
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy, TokenRateLimiter
from tests.sdk.helpers import MESSAGES, chat_json, chunk, event_stream, sse, unreachable

A = "http://a.test:8000/v1"
B = "http://b.test:8000/v1"
ANY = r"http://[ab]\.test:8000/v1/chat/completions"
TOKENS_PER_S = 10_000
#: The wall clock the fake clock's HTTP-dates are written against.
WALL = 1_800_000_000.0

_durations = st.sampled_from(
    ["86000s", "24h", "23h59m", "6m0s", "60", "86400", "1s", "20ms", "0s", "0", "-1", "soon"]
)
_counts = st.sampled_from(["0", "1", "999999999999999999", "-3", "x"])


@st.composite
def _retry_after(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["seconds", "date", "text"]))
    if kind == "seconds":
        return str(draw(st.integers(min_value=-10, max_value=10**7)))
    if kind == "date":
        skew = draw(st.floats(min_value=-2 * 86_400, max_value=2 * 86_400))
        return email.utils.formatdate(WALL + skew, usegmt=True)
    return draw(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12))


_headers = st.fixed_dictionaries(
    {},
    optional={
        "retry-after": _retry_after(),
        "retry-after-ms": st.integers(min_value=-10, max_value=10**11).map(str),
        "x-ratelimit-remaining-tokens": _counts,
        "x-ratelimit-reset-tokens": _durations,
        "x-ratelimit-remaining-requests": _counts,
        "x-ratelimit-reset-requests": _durations,
        "x-queue-depth": st.sampled_from(["0", "5", "999999999999999999"]),
        "x-kv-cache-usage": st.sampled_from(["0.1", "0.99", "1.0"]),
        "x-load-shed": st.sampled_from(["queue_full", "engine_restart", "warming", "draining"]),
        "x-should-retry": st.sampled_from(["true", "false"]),
    },
)


@st.composite
def answers(draw: st.DrawFn) -> tuple[int, dict[str, str], int | None, bool]:
    """One answer: its status, headers, the usage it reports, and whether the call
    that receives it is a stream."""
    status = draw(st.sampled_from([200, 200, 429, 500, 503]))
    usage = draw(st.none() | st.integers(min_value=-(10**18), max_value=10**18))
    return status, draw(_headers), usage, draw(st.booleans())


def _poisoned(status: int, headers: dict[str, str], usage: int | None, stream: bool) -> Any:
    totals = {} if usage is None else {"prompt_tokens": 1, "completion_tokens": 1}
    report = {**totals, "total_tokens": usage} if usage is not None else None
    if status != 200:
        return httpx.Response(status, json={"error": {"message": "no"}}, headers=headers)
    if stream:
        last = chunk("", choices=[], usage=report) if report else chunk("!")
        return event_stream(sse(chunk("hi"), last), **headers)
    body = chat_json(usage=report) if report else chat_json()
    return httpx.Response(200, content=json.dumps(body).encode(), headers=headers)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=answers())
def test_no_single_answer_stops_calls_to_another_endpoint(
    answer: tuple[int, dict[str, str], int | None, bool],
) -> None:
    status, headers, usage, stream = answer
    clock = FakeClock()
    bucket = TokenRateLimiter(tokens_per_minute=TOKENS_PER_S * 60)
    policy = TokenPolicy(server_context_windows=False, server_tokenize=False, rate_limiter=bucket)
    poisoned: list[str] = []

    def respond(request: httpx.Request) -> httpx.Response:
        if not poisoned:
            poisoned.append(f"{request.url.host}:{request.url.port}")
            return _poisoned(status, headers, usage, stream)  # type: ignore[no-any-return]
        return httpx.Response(200, json=chat_json())

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY).mock(side_effect=respond)
        client = stormguard.Client(
            base_url=[A, B],
            model="gpt-4o",
            api_key="sk-test",
            clock=clock,
            token_policy=policy,
            retry_budget=stormguard.RetryBudget(ratio=1.0, min_retries_per_second=10, clock=clock),
            ejection=stormguard.EjectionConfig(probe=unreachable),
            telemetry=None,
            # A key's quota is the key's on every endpoint: a quota 429 paces them
            # all, at most MAX_PAUSE_S (policies/quota/test_quota_flow.py holds that bound).
            quota=None,
        )
        try:
            if stream:
                for _ in client.chat.completions.create(
                    messages=MESSAGES, max_tokens=5, stream=True
                ):
                    pass
            else:
                client.chat.completions.create(messages=MESSAGES, max_tokens=5)
        except stormguard.StormguardError:
            pass  # the call that met the answer may fail: the calls after it may not
        limiter = client.concurrency
        assert limiter is not None
        # The endpoint that answered is paused at most MAX_PAUSE_S, whatever it said.
        assert limiter.endpoint(poisoned[0]).state().paused_for <= MAX_PAUSE_S
        for _ in range(5):
            start = clock.now()
            result = client.chat.completions.create(messages=MESSAGES, max_tokens=5, timeout=5.0)
            # The bucket's share: at most twice one reservation (a few dozen tokens)
            # plus this call's own, at 10,000 tokens/s; the other endpoint takes it.
            assert clock.now() - start <= 0.05, result.attempt_history
        clock.advance(MAX_PAUSE_S + 0.01)
        assert limiter.endpoint(poisoned[0]).has_room()
        client.close()


# -- every per-key table is bounded ------------------------------------------------------


class Deploys:
    """A DNS name whose 64 pods get new addresses at every deploy (every look)."""

    def __init__(self) -> None:
        self.deploys = 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.deploys += 1
        base = self.deploys * 64
        return [
            f"10.{(base + i) // 65536 % 256}.{(base + i) // 256 % 256}.{(base + i) % 256}"
            for i in range(64)
        ]


def test_churning_addresses_leave_no_state_behind() -> None:
    # 2,000 calls while a deploy gives the name's 64 pods new addresses every 10
    # calls (12,800 addresses in all): the limiter kept one entry per address ever
    # seen (18,228 for 64 live ones after 20,000 calls), and stats() returned them all.
    clock = FakeClock()
    deploys = Deploys()
    http = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=chat_json()))
    )
    client = stormguard.Client(
        base_url="dns+http://vllm.ns.svc:8000/v1",
        model="m",
        api_key="sk-test",
        clock=clock,
        http_client=http,
        discovery=stormguard.DiscoveryConfig(
            resolver=deploys, executor=lambda look: look(), refresh_interval=5.0
        ),
        ejection=stormguard.EjectionConfig(probe=unreachable),
        telemetry=None,
    )
    limiter, breakers = client.concurrency, client._core.breakers
    assert limiter is not None and breakers is not None
    for i in range(2_000):
        client.chat.completions.create(messages=MESSAGES)
        if i % 10 == 9:
            assert len(limiter.state()) <= 64 and len(breakers) <= 64
            clock.advance(5.0)  # the next call looks again, and finds the next deploy
    assert deploys.deploys >= 200
    stats = client.stats()
    live = set(stats.endpoint_names)
    assert len(live) == 64
    assert {s.endpoint for s in stats.concurrency} <= live
    assert {b.name.split("@")[1] for b in stats.breakers} <= live
    assert {e.endpoint for e in stats.endpoints} == live
    client.close()
    http.close()


def test_the_metric_gauges_keep_a_bounded_set_of_series() -> None:
    # The gauges' series are kept per endpoint and per breaker in the one Telemetry
    # every client shares by default: names that come and go must not pile up.
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = ClientMetrics(provider.get_meter("test"))
    for i in range(20_000):
        name = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000"
        metrics.concurrency_limit(name, 20)
        metrics.breaker_state(f"m@{name}", "open")
        metrics.endpoint_status(name, "ejected")
        metrics.discovered(f"svc-{i}:8000", 3)
    gauges = _gauges(reader)
    assert all(len(points) == MAX_SERIES for points in gauges.values()), gauges.keys()
    last = "10.0.78.31:8000"  # the latest of each is kept
    assert ("10.0.78.31:8000", 20) in gauges["stormguard.client.concurrency.limit"]
    metrics.forget_endpoints([last, "never.seen:80"])
    gauges = _gauges(reader)
    for series in gauges.values():
        assert not any(last in str(name) for name, _ in series)
    provider.shutdown()


def test_churning_addresses_leave_no_series_behind() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    clock = FakeClock()
    http = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=chat_json()))
    )
    client = stormguard.Client(
        base_url="dns+http://vllm.ns.svc:8000/v1",
        model="m",
        api_key="sk-test",
        clock=clock,
        http_client=http,
        discovery=stormguard.DiscoveryConfig(
            resolver=Deploys(), executor=lambda look: look(), refresh_interval=5.0
        ),
        ejection=stormguard.EjectionConfig(probe=unreachable),
        telemetry=Telemetry(meter_provider=provider),
    )
    for i in range(400):
        client.chat.completions.create(messages=MESSAGES)
        if i % 10 == 9:
            clock.advance(5.0)
    live = set(client.stats().endpoint_names)
    limits = _gauges(reader)["stormguard.client.concurrency.limit"]
    assert 0 < len(limits) <= 64 and {name for name, _ in limits} <= live
    client.close()
    http.close()
    provider.shutdown()


def _gauges(reader: InMemoryMetricReader) -> dict[str, list[tuple[object, object]]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: [(next(iter(p.attributes.values())), p.value) for p in metric.data.data_points]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name.endswith(("limit", "state", "status", "endpoints"))
    }
