"""The quota in the app, on a fake clock: who is charged what, OpenAI's 429s with each
Retry-After choice, the x-ratelimit-* headers (and their off switch), the routes that
are free, the per-key counts in /metrics, and the admin switch."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard_server.admin import create_admin_app
from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, QuotaConfig, ServerConfig
from stormguard_server.quota.buckets import key_label
from stormguard_server.quota.http import retry_after_headers
from stormguard_server.state import ServerState
from tests.server.conftest import FAST_ENGINE
from tests.server.fake_clock import FakeClock
from tests.server.quota.test_quota import parse_go_duration

ENGINE = dataclasses.replace(FAST_ENGINE, natural_output_tokens=4, warmup_probe_tokens=1)
KEY = "sk-test-key-0123456789abcdef"
OTHER = "sk-other-key-0123456789abcdef"
BODY = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
RATE_LIMIT_HEADERS = {
    f"x-ratelimit-{what}-{kind}"
    for what in ("limit", "remaining", "reset")
    for kind in ("requests", "tokens")
}


@dataclasses.dataclass
class Served:
    client: httpx.AsyncClient
    state: ServerState
    clock: FakeClock

    async def post(self, path: str, body: dict[str, Any], key: str | None = KEY) -> httpx.Response:
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        return await self.clock.drive(self.client.post(path, json=body, headers=headers))

    async def complete(
        self, max_tokens: int | None = 8, key: str | None = KEY, **extra: Any
    ) -> httpx.Response:
        body: dict[str, Any] = {"prompt": "hello there", **extra}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return await self.post("/v1/completions", body, key=key)

    async def metrics(self) -> str:
        return (await self.clock.drive(self.client.get("/metrics"))).text

    def engine_requests(self) -> int:
        return self.state.engine.stats.requests_started


@asynccontextmanager
async def serve(admission: bool = True, **quota: Any) -> AsyncIterator[Served]:
    clock = FakeClock()
    config = ServerConfig(
        engine=ENGINE,
        admission=AdmissionConfig(enabled=admission),
        quota=QuotaConfig(**quota),
    )
    state = build_state(config, clock=clock)
    app = create_app(state=state)
    await clock.drive(state.engine.start())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield Served(client, state, clock)


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


async def test_a_burst_past_the_rpm_gets_openais_429_and_passes_after_the_wait() -> None:
    async with serve(requests_per_minute=3, retry_after="ms") as served:
        for remaining in (2, 1, 0):
            ok = await served.complete()
            assert ok.status_code == 200
            assert ok.headers["x-ratelimit-remaining-requests"] == str(remaining)
        started = served.engine_requests()
        refused = await served.complete()
        assert refused.status_code == 429
        error = error_of(refused)
        assert error["type"] == "requests"
        assert error["code"] == "rate_limit_exceeded"
        assert error["param"] is None
        label = key_label({"authorization": f"Bearer {KEY}"})
        assert re.fullmatch(
            rf"Rate limit reached for stormguard-sim in organization org-{label} on requests "
            r"per min \(RPM\): Limit 3, Used 3, Requested 1\. Please try again in "
            r"(\d+\.?\d*)s\. Visit https://platform\.openai\.com/account/rate-limits to "
            r"learn more\.",
            error["message"],
        )
        wait_ms = int(refused.headers["retry-after-ms"])
        assert 19_000 < wait_ms <= 20_000
        assert refused.headers["x-ratelimit-limit-requests"] == "3"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert served.engine_requests() == started  # a 429 reaches no engine
        assert KEY not in refused.text
        await served.clock.advance(wait_ms / 1000 - 0.01)
        assert (await served.complete()).status_code == 429
        await served.clock.advance(0.01)
        assert (await served.complete()).status_code == 200


@pytest.mark.parametrize("mode", ["none", "seconds", "ms", "azure"])
async def test_each_retry_after_choice_sends_its_one_header(mode: str) -> None:
    async with serve(requests_per_minute=1, retry_after=mode) as served:
        assert (await served.complete()).status_code == 200
        refused = await served.complete()
        assert refused.status_code == 429
        said = re.search(r"Please try again in (\S+)\. ", error_of(refused)["message"])
        assert said is not None
        wait_ms = round(parse_go_duration(said[1]) * 1000)
        assert 59_000 < wait_ms <= 60_000
        expected = {
            "none": {},
            "seconds": {"retry-after": str(math.ceil(wait_ms / 1000))},
            "ms": {"retry-after-ms": str(wait_ms)},
            "azure": {"x-ms-retry-after-ms": str(wait_ms)},
        }[mode]
        hints = {"retry-after", "retry-after-ms", "x-ms-retry-after-ms"}
        assert {k: v for k, v in refused.headers.items() if k in hints} == expected


async def test_the_charge_is_prompt_plus_max_tokens_or_the_default_and_never_refunded() -> None:
    async with serve(tokens_per_minute=100_000, default_max_tokens=50) as served:
        label = key_label({"authorization": f"Bearer {KEY}"})

        def charged() -> int:
            return dict(served.state.quota.counts())[label].tokens_charged

        asked = await served.complete(max_tokens=40)
        usage = asked.json()["usage"]
        assert usage["completion_tokens"] < 40  # a short natural answer: nothing back
        assert charged() == usage["prompt_tokens"] + 40
        before = charged()
        default = await served.complete(max_tokens=None)
        assert charged() - before == default.json()["usage"]["prompt_tokens"] + 50
        before = charged()
        chat = await served.post(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7},
        )
        assert charged() - before == chat.json()["usage"]["prompt_tokens"] + 7
        before = charged()
        responses = await served.post("/v1/responses", {"input": "hi", "max_output_tokens": 9})
        assert charged() - before == responses.json()["usage"]["input_tokens"] + 9
        before = charged()
        embedded = await served.post("/v1/embeddings", {"input": ["one two", "three"]})
        assert charged() - before == embedded.json()["usage"]["prompt_tokens"]


async def test_a_request_over_the_tpm_limit_is_too_large_with_no_retry_after() -> None:
    async with serve(tokens_per_minute=50) as served:
        refused = await served.complete(max_tokens=100)
        assert refused.status_code == 429
        error = error_of(refused)
        assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
        assert error["message"].startswith("Request too large for stormguard-sim")
        assert "retry-after" not in refused.headers
        assert refused.headers["x-ratelimit-remaining-tokens"] == "50"


@pytest.mark.parametrize("how", ["flag", "admin", "daily"])
async def test_insufficient_quota(how: str) -> None:
    quota = {"flag": {"insufficient_quota": True}, "admin": {"requests_per_minute": 100}}
    async with serve(**quota.get(how, {"tokens_per_day": 100})) as served:
        if how == "admin":
            assert (await served.complete()).status_code == 200
            admin = create_admin_app(served.state, token="a-test-admin-token-0123")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=admin, client=("127.0.0.1", 5000)),
                base_url="http://127.0.0.1",
                headers={"authorization": "Bearer a-test-admin-token-0123"},
            ) as client:
                # A GET only reads.
                read = await client.get("/admin/quota", params={"insufficient_quota": "true"})
                assert read.json()["insufficient_quota"] is False
                assert read.json()["keys"] == 1
                switched = await client.post("/admin/quota", json={"insufficient_quota": True})
                assert switched.json()["insufficient_quota"] is True
        if how == "daily":
            assert (await served.complete(max_tokens=80)).status_code == 200
        refused = await served.complete(max_tokens=30)
        assert refused.status_code == 429
        error = error_of(refused)
        assert error == {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details. For more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
        assert not {"retry-after", "retry-after-ms", "x-ms-retry-after-ms"} & set(refused.headers)
        # Another key is just as out of credit when forced; has its own day otherwise.
        other = await served.complete(max_tokens=30, key=OTHER)
        assert other.status_code == (200 if how == "daily" else 429)


async def test_two_keys_are_independent_and_no_key_is_one_anonymous_key() -> None:
    async with serve(requests_per_minute=1) as served:
        assert (await served.complete()).status_code == 200
        assert (await served.complete()).status_code == 429
        assert (await served.complete(key=OTHER)).status_code == 200
        assert (await served.complete(key=None)).status_code == 200  # anonymous
        assert (await served.complete(key=None)).status_code == 429
        # Azure's api-key header is the same key as the bearer token.
        same = await served.clock.drive(
            served.client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers={"api-key": OTHER}
            )
        )
        assert same.status_code == 429


async def test_headers_on_every_answer_of_a_charged_route_and_no_other() -> None:
    async with serve(requests_per_minute=10, tokens_per_minute=1000) as served:
        bad = await served.post("/v1/chat/completions", {"messages": []})
        assert bad.status_code == 400
        assert set(bad.headers) >= RATE_LIMIT_HEADERS
        assert bad.headers["x-ratelimit-remaining-requests"] == "10"  # a 400 costs nothing
        streamed = await served.complete(stream=True)
        assert streamed.status_code == 200
        assert streamed.headers["x-ratelimit-remaining-requests"] == "9"
        embedded = await served.post("/v1/embeddings", {"input": "x"})
        assert embedded.headers["x-ratelimit-remaining-requests"] == "8"
        for path in ("/v1/models", "/health", "/ready", "/metrics", "/v1/models/stormguard-sim"):
            response = await served.clock.drive(
                served.client.get(path, headers={"authorization": f"Bearer {KEY}"})
            )
            assert response.status_code == 200, path
            assert not RATE_LIMIT_HEADERS & set(response.headers), path
        tokenize = await served.post("/tokenize", {"prompt": "x"})
        assert tokenize.status_code == 200
        assert not RATE_LIMIT_HEADERS & set(tokenize.headers)
        after = await served.complete()
        assert after.headers["x-ratelimit-remaining-requests"] == "7"  # none of them charged


@pytest.mark.parametrize("admission", [True, False])
async def test_a_streamed_request_over_the_quota_gets_the_json_429(admission: bool) -> None:
    """The charge comes before the stream starts, with admission on or off."""
    async with serve(admission=admission, requests_per_minute=1) as served:
        ok = await served.complete(stream=True)
        assert ok.status_code == 200
        assert ok.headers["content-type"].startswith("text/event-stream")
        refused = await served.complete(stream=True)
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/json"
        assert error_of(refused)["code"] == "rate_limit_exceeded"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_no_quota_headers_when_switched_off() -> None:
    async with serve(requests_per_minute=1, headers=False, retry_after="ms") as served:
        ok = await served.complete()
        refused = await served.complete()
        assert (ok.status_code, refused.status_code) == (200, 429)
        assert not any(name.startswith("x-ratelimit-") for name in ok.headers)
        assert not any(name.startswith("x-ratelimit-") for name in refused.headers)
        assert "retry-after-ms" in refused.headers  # the Retry-After choice still applies


async def test_metrics_count_per_key_under_a_hash_never_the_key() -> None:
    async with serve(requests_per_minute=2, tokens_per_minute=300) as served:
        for _ in range(3):
            await served.complete(max_tokens=10)
        assert (await served.complete(max_tokens=400)).status_code == 429  # too large
        await served.complete(max_tokens=10, key=OTHER)
        text = await served.metrics()
        assert KEY not in text and OTHER not in text
        label = key_label({"authorization": f"Bearer {KEY}"})
        other = key_label({"authorization": f"Bearer {OTHER}"})
        samples = dict(
            line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("stormguard_quota")
        )
        assert float(samples[f'stormguard_quota_admitted_total{{key="{label}"}}']) == 2
        assert float(samples[f'stormguard_quota_admitted_total{{key="{other}"}}']) == 1
        refused = f'stormguard_quota_refused_total{{key="{label}",reason="requests"}}'
        assert float(samples[refused]) == 1
        too_large = f'stormguard_quota_refused_total{{key="{label}",reason="too_large"}}'
        assert float(samples[too_large]) == 1
        charged = float(samples[f'stormguard_quota_tokens_charged_total{{key="{label}"}}'])
        assert charged > 20
        assert float(samples["stormguard_quota_keys"]) == 2
        # A quota 429 is an answer like any other.
        assert 'stormguard_responses_total{route="/v1/completions",status="429"} 2.0' in text


async def test_the_metrics_key_table_is_bounded() -> None:
    async with serve(requests_per_minute=5, max_keys=3) as served:
        for n in range(8):
            assert (
                await served.complete(max_tokens=1, key=f"sk-key-number-{n}")
            ).status_code == 200
        text = await served.metrics()
        assert text.count("stormguard_quota_admitted_total{") == 3
        assert "stormguard_quota_keys 3.0" in text
        assert "stormguard_quota_keys_evicted_total 5.0" in text


async def test_no_quota_by_default_no_headers_no_series() -> None:
    async with serve() as served:
        assert served.state.quota is None
        for _ in range(5):
            response = await served.complete()
            assert response.status_code == 200
            assert not any(name.startswith("x-ratelimit-") for name in response.headers)
        assert "stormguard_quota" not in await served.metrics()


# A key header's value: any bytes, or any bytes around a secret whose echo would show.
SECRET = b"sk-Secret-0123456789"
KEY_HEADER = st.one_of(
    st.none(),
    st.binary(max_size=60),
    st.tuples(st.sampled_from([b"", b"Bearer ", b"bearer\t"]), st.binary(max_size=20)).map(
        lambda parts: parts[0] + SECRET + parts[1]
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(authorization=KEY_HEADER, api_key=KEY_HEADER)
async def test_any_bytes_in_the_key_headers_are_answered_and_never_echoed(
    authorization: bytes | None, api_key: bytes | None
) -> None:
    """Whatever the key headers hold, the first request passes and the second is over the
    quota; the key never comes back (``SECRET``, when drawn, is in neither answer)."""
    headers = [(b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    if api_key is not None:
        headers.append((b"api-key", api_key))
    async with serve(requests_per_minute=1, tokens_per_minute=1000) as served:
        app = served.client._transport.app  # type: ignore[attr-defined]
        for expected in (200, 429):
            sent: list[dict[str, Any]] = []
            answered = asyncio.Event()
            pending = [{"type": "http.request", "body": BODY, "more_body": False}]

            async def receive(
                pending: list[dict[str, Any]] = pending, answered: asyncio.Event = answered
            ) -> dict[str, Any]:
                if pending:
                    return pending.pop()
                await answered.wait()  # the client stays until its answer ends
                return {"type": "http.disconnect"}

            async def send(
                message: dict[str, Any],
                sent: list[dict[str, Any]] = sent,
                answered: asyncio.Event = answered,
            ) -> None:
                sent.append(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    answered.set()

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/v1/completions",
                "raw_path": b"/v1/completions",
                "query_string": b"",
                "headers": headers,
                "client": ("127.0.0.1", 1234),
                "server": ("testserver", 80),
            }
            await served.clock.drive(app(scope, receive, send))
            assert sent[0]["status"] == expected
            names = {name for name, _ in sent[0]["headers"]}
            assert b"x-ratelimit-remaining-requests" in names
            answer = b"\n".join(
                [value for _, value in sent[0]["headers"]] + [m.get("body", b"") for m in sent[1:]]
            )
            assert SECRET not in answer


def test_retry_after_in_seconds_is_the_wait_in_ms_rounded_up() -> None:
    """The whole seconds of ``retry-after`` are the message's wait rounded up."""
    for wait in (0.0004, 0.5, 1.0, 1.001, 19.928, 59.9999):
        seconds = int(retry_after_headers(wait, "seconds")["retry-after"])
        ms = int(retry_after_headers(wait, "ms")["retry-after-ms"])
        assert seconds == max(1, math.ceil(ms / 1000))
        assert ms >= wait * 1000 - 1e-6
    assert retry_after_headers(None, "seconds") == {}
