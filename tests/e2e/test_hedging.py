"""Hedged requests end to end on two real reference servers, one made slow (a long
added latency before its engine takes a request): a call whose prompt cache key
sends it to the slow server is hedged to the fast one, answers near the fast
server's latency, and the slow server sees its request's client go away. Plain
calls and streams, sync (racer threads, the loser's socket shut down) and async
(racer tasks, the loser cancelled).

The only timing asserted is far from the edge: the slow server holds a request
30 s, the hedge is sent after 0.2 s, and the call must end within 10 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

import stormguard
from stormguard import AttemptRecord, Endpoint, HedgePolicy
from stormguard._policies.routing.affinity import ranking
from tests.e2e.conftest import ServerFactory, spec
from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
SLOW_MS = 30_000


def disconnects(server: RunningServer) -> float:
    return sum(
        v for k, v in server.metrics().items() if k.startswith("stormguard_client_disconnects")
    )


def slow_key(client: stormguard.Client | stormguard.AsyncClient, slow: str) -> str:
    """A prompt cache key whose home is the slow server (the primary goes there)."""
    affinity = client._core.affinity
    assert affinity is not None
    for n in range(1000):
        key = affinity.key_of({"prompt_cache_key": f"tenant-{n}"})
        assert key is not None
        if ranking(key, client._core.picker.states)[0].name == slow:
            return f"tenant-{n}"
    raise AssertionError("no key homes on the slow server")


async def wait_for_disconnects(server: RunningServer, at_least: float) -> float:
    """The slow server's count of clients gone, once it reaches ``at_least`` (10 s at most)."""
    seen = disconnects(server)
    for _ in range(100):
        if seen >= at_least:
            return seen
        await asyncio.sleep(0.1)
        seen = disconnects(server)
    return seen


def check_call(text: str, elapsed: float, history: Sequence[AttemptRecord]) -> None:
    """One call to the slow server: answered, well within the 30 s it holds a
    request, by the hedge to the fast one, the primary recorded as the loser."""
    assert text
    assert elapsed < 10.0, elapsed
    assert [(r.endpoint, r.outcome, r.hedge) for r in history] == [
        ("slow", "hedge_lost", False),
        ("fast", "ok", True),
    ]


def check_stats(client: stormguard.Client | stormguard.AsyncClient) -> None:
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_won) == (2, 2)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_call_to_the_slow_server_is_answered_by_the_fast_one(
    mode: str, stream: bool, stormguard_server_factory: ServerFactory
) -> None:
    slow, fast = stormguard_server_factory.together(
        spec("--added-latency-ms", str(SLOW_MS)), spec()
    )
    if mode == "sync":
        _sync_script(slow, fast, stream)
    else:
        asyncio.run(_script(slow, fast, stream))


def _sync_script(slow: RunningServer, fast: RunningServer, stream: bool) -> None:
    with stormguard.Client(
        base_url=[Endpoint(slow.base_url, name="slow"), Endpoint(fast.base_url, name="fast")],
        model=MODEL,
        timeout=60,
        hedge=HedgePolicy(delay=0.2, budget=1.0),
    ) as client:
        key = slow_key(client, "slow")
        before = disconnects(slow)
        for round_ in range(2):
            started = time.monotonic()
            messages = [{"role": "user", "content": f"hello {round_}"}]
            if stream:
                chunks = client.chat.completions.create(
                    messages=messages,
                    max_tokens=8,
                    stream=True,
                    extra_body={"prompt_cache_key": key},
                )
                with chunks:  # read from this thread, opened in a racer's
                    text = "".join(c.choices[0].delta.content or "" for c in chunks)
                history = chunks.attempt_history
            else:
                resp = client.chat.completions.create(
                    messages=messages, max_tokens=8, extra_body={"prompt_cache_key": key}
                )
                text = resp.choices[0].message.content or ""
                history = resp.attempt_history
            check_call(text, time.monotonic() - started, history)
        assert asyncio.run(wait_for_disconnects(slow, before + 2)) >= before + 2
        check_stats(client)


async def _script(slow: RunningServer, fast: RunningServer, stream: bool) -> None:
    async with stormguard.AsyncClient(
        base_url=[Endpoint(slow.base_url, name="slow"), Endpoint(fast.base_url, name="fast")],
        model=MODEL,
        timeout=60,
        hedge=HedgePolicy(delay=0.2, budget=1.0),
    ) as client:
        key = slow_key(client, "slow")
        before = disconnects(slow)
        for round_ in range(2):
            started = time.monotonic()
            if stream:
                chunks = await client.chat.completions.create(
                    messages=[{"role": "user", "content": f"hello {round_}"}],
                    max_tokens=8,
                    stream=True,
                    extra_body={"prompt_cache_key": key},
                )
                text = "".join([c.choices[0].delta.content or "" async for c in chunks])
                history = chunks.attempt_history
            else:
                resp = await client.chat.completions.create(
                    messages=[{"role": "user", "content": f"hello {round_}"}],
                    max_tokens=8,
                    extra_body={"prompt_cache_key": key},
                )
                text = resp.choices[0].message.content or ""
                history = resp.attempt_history
            check_call(text, time.monotonic() - started, history)
        # The slow server saw both clients leave (the hedges' losers, closed).
        assert await wait_for_disconnects(slow, before + 2) >= before + 2
        check_stats(client)
