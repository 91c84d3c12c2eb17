"""Latency-aware choice end to end on two real reference servers, one made slow by
a long added latency before its engine takes a request (as a replica slowed by
someone else's load: it sends no load header saying so). With ``LatencyRouting``,
once each server has answered once, the calls go to the fast one: plain calls
(ranked by time per completion token) and streams (by time to the first chunk),
sync and async.

Calls are sequential, so this client never has more than one in flight and load
alone ranks the two alike (a coin toss each call). The margin asserted is wide:
the slow server adds 1.5 s to every request, and at most 4 of 16 calls may go
there (its first answer, and a probe if the fast one hiccups). Each server answers
one request before the client starts: a fresh server's first answer is slow, and
one slow answer keeps an endpoint avoided for about ``decay`` seconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

import stormguard
from stormguard import Endpoint, LatencyRouting
from tests.e2e.conftest import ServerFactory, spec
from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
SLOW_MS = 1_500
CALLS = 16


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_most_calls_go_to_the_fast_server(
    mode: str, stream: bool, stormguard_server_factory: ServerFactory
) -> None:
    slow, fast = stormguard_server_factory.together(
        spec("--added-latency-ms", str(SLOW_MS)), spec()
    )
    for server in (slow, fast):  # a fresh server's first answer is slower: not measured
        _warm(server)
    endpoints = [Endpoint(slow.base_url, name="slow"), Endpoint(fast.base_url, name="fast")]
    if mode == "sync":
        served = _sync_calls(endpoints, stream)
    else:
        served = asyncio.run(_async_calls(endpoints, stream))
    assert served["slow"] <= 4, served
    assert served["fast"] >= CALLS - 4, served
    assert _requests(slow) == served["slow"] + 1  # and the warm-up's


def _warm(server: RunningServer) -> None:
    """One request straight to ``server``, outside the client: a server's first answer
    pays for its start (a peak the estimate would keep for about ``decay`` seconds)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "warm"}], "max_tokens": 2}
    httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30).raise_for_status()


def _sync_calls(endpoints: list[Endpoint], stream: bool) -> Counter[str]:
    served: Counter[str] = Counter()
    with stormguard.Client(
        base_url=endpoints, model=MODEL, timeout=60, latency_routing=LatencyRouting()
    ) as client:
        for n in range(CALLS):
            messages = [{"role": "user", "content": f"hello {n}"}]
            if stream:
                with client.chat.completions.create(
                    messages=messages, max_tokens=8, stream=True
                ) as chunks:
                    assert "".join(c.choices[0].delta.content or "" for c in chunks)
                history = chunks.attempt_history
            else:
                resp = client.chat.completions.create(messages=messages, max_tokens=8)
                assert resp.choices[0].message.content
                history = resp.attempt_history
            served[history[-1].endpoint or "?"] += 1
    return served


async def _async_calls(endpoints: list[Endpoint], stream: bool) -> Counter[str]:
    served: Counter[str] = Counter()
    async with stormguard.AsyncClient(
        base_url=endpoints, model=MODEL, timeout=60, latency_routing=LatencyRouting()
    ) as client:
        for n in range(CALLS):
            messages = [{"role": "user", "content": f"hello {n}"}]
            if stream:
                chunks = await client.chat.completions.create(
                    messages=messages, max_tokens=8, stream=True
                )
                async with chunks:
                    assert "".join([c.choices[0].delta.content or "" async for c in chunks])
                history = chunks.attempt_history
            else:
                resp = await client.chat.completions.create(messages=messages, max_tokens=8)
                assert resp.choices[0].message.content
                history = resp.attempt_history
            served[history[-1].endpoint or "?"] += 1
    return served


def _requests(server: RunningServer) -> float:
    """The requests the server's engine took (its own count, not the client's)."""
    return sum(v for k, v in server.metrics().items() if k.startswith("stormguard_admitted_total"))
