"""The hosted-API quota on the real server: a burst past one key's RPM gets OpenAI's
429s with the x-ratelimit-* headers and a Retry-After, and a request sent after the
advertised wait passes."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import ServerFactory

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-quota-0123456789abcdef"
RPM = 30
BURST = 40
BODY = {"model": "stormguard-sim", "prompt": "hello", "max_tokens": 1}
AUTH = {"authorization": f"Bearer {KEY}"}
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}


def go_seconds(text: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


async def test_a_burst_gets_429s_with_the_headers_and_passes_after_the_advertised_wait(
    stormguard_server_factory: ServerFactory,
) -> None:
    server = stormguard_server_factory(
        "--quota-rpm", str(RPM), "--quota-tpm", "100000", "--quota-retry-after", "ms"
    )
    url = server.url("/v1/completions")
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(limits=limits, timeout=30, headers=AUTH) as client:
        started = time.monotonic()
        burst = await asyncio.gather(*(client.post(url, json=BODY) for _ in range(BURST)))
        elapsed = time.monotonic() - started
        statuses = [r.status_code for r in burst]
        passed = statuses.count(200)
        # A full bucket of 30, and one more for every 2 s the burst took.
        assert RPM <= passed <= RPM + 1 + elapsed * RPM / 60, (statuses, elapsed)
        assert set(statuses) == {200, 429}
        refused = [r for r in burst if r.status_code == 429]
        for response in refused:
            error = response.json()["error"]
            assert (error["type"], error["code"], error["param"]) == (
                "requests",
                "rate_limit_exceeded",
                None,
            )
            assert "on requests per min (RPM): Limit 30, Used 30, Requested 1." in error["message"]
            headers = response.headers
            assert headers["x-ratelimit-limit-requests"] == str(RPM)
            assert headers["x-ratelimit-remaining-requests"] == "0"
            assert headers["x-ratelimit-limit-tokens"] == "100000"
            assert 0 < go_seconds(headers["x-ratelimit-reset-requests"]) <= 60
            wait_ms = int(headers["retry-after-ms"])
            assert 0 < wait_ms <= 60_000 / RPM
            said = re.search(r"Please try again in (\S+)\. ", error["message"])
            assert said is not None and round(go_seconds(said[1]) * 1000) == wait_ms
        for response in burst:
            if response.status_code == 200:
                assert 0 <= int(response.headers["x-ratelimit-remaining-requests"]) < RPM

        # Wait what a 429 says, then ask again: it passes. (On a machine slow enough
        # that a request refilled while this one was on its way, drain and try again.)
        for _ in range(5):
            probe = await client.post(url, json=BODY)
            if probe.status_code == 429:
                refused.append(probe)
                await asyncio.sleep(int(probe.headers["retry-after-ms"]) / 1000)
                after = await client.post(url, json=BODY)
                assert after.status_code == 200, after.text
                break
            assert probe.status_code == 200
        else:
            pytest.fail("no 429 after the burst")
        text = (await client.get(server.url("/metrics"))).text

    assert KEY not in text
    label = hashlib.sha256(KEY.encode()).hexdigest()[:12]
    refused_sample = f'stormguard_quota_refused_total{{key="{label}",reason="requests"}} '
    assert f"{refused_sample}{float(len(refused))}" in text.splitlines()
    assert "stormguard_quota_keys 1.0" in text.splitlines()


async def test_openai_python_reads_the_429_as_a_rate_limit_error(
    stormguard_server_factory: ServerFactory,
) -> None:
    server = stormguard_server_factory("--quota-rpm", "1", "--quota-retry-after", "seconds")
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0) as client:
        await client.completions.create(model="stormguard-sim", prompt="hi", max_tokens=1)
        with pytest.raises(openai.RateLimitError) as raised:
            await client.completions.create(model="stormguard-sim", prompt="hi", max_tokens=1)
    error = raised.value
    assert error.code == "rate_limit_exceeded"
    assert error.type == "requests"
    assert error.response.headers["retry-after"] == "60"
    assert KEY not in str(error)
