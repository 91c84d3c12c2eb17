"""A finished call leaves no reference cycle behind: its objects are freed by their
reference counts when it ends, not by the cyclic garbage collector.

That matters under a burst: a thousand calls that each left a cycle feed the
collector, whose full collections stop every task of the loop for about 100 ms
(docs/benchmarks.md, "1,000 concurrent calls on one event loop"). The cycles
this holds closed: tenacity's loop keeping its last step (bound methods of
itself), an error's traceback holding frames that hold the call (which held the
error; or, for a connection that failed, a frame that held the error it raised),
tenacity's own re-raise frames, and the client's own pool's timed stream
holding its response.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest
import respx

import stormguard
from stormguard._call.pipeline import LogicalCall
from tests.sdk.helpers import MESSAGES, Api, chat_json

OUTCOMES = {
    "succeeds": [200],
    "refused, not retried": [400],
    "retried until it stops": [503, 503],
    "retried, then succeeds": [503, 200],
}


def _response(status: int) -> httpx.Response:
    if status == 200:
        return httpx.Response(200, json=chat_json())
    return httpx.Response(status, json={"error": {"message": "no"}}, headers={"retry-after": "0"})


async def calls_the_collector_freed(one: Callable[[], Awaitable[None]]) -> list[LogicalCall]:
    """The calls of three runs of ``one`` (after a first: lazy imports, caches) that
    only the cyclic collector freed, not their reference counts. What existed before
    them is frozen (``gc.freeze``): the collections look at the runs' objects only,
    not at the whole suite's heap, which made each of these tests take seconds."""
    await one()
    gc.collect()
    gc.disable()
    gc.freeze()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds, to look at it
    try:
        for _ in range(3):
            await one()
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, LogicalCall)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("outcome", list(OUTCOMES))
async def test_a_finished_call_leaves_no_cycle(
    api: Api, mock: respx.MockRouter, outcome: str
) -> None:
    statuses = itertools.cycle(OUTCOMES[outcome])
    mock.post("/chat/completions").mock(side_effect=lambda request: _response(next(statuses)))
    client = api.client(retry_policy=stormguard.RetryPolicy(max_attempts=2))

    async def one() -> None:
        with contextlib.suppress(stormguard.APIError):
            await api.run(client.chat.completions.create(messages=MESSAGES))

    assert await calls_the_collector_freed(one) == []


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("backend", ["sync", "httpx", "aiohttp"])
async def test_a_call_whose_connection_is_refused_leaves_no_cycle(backend: str) -> None:
    # A real refused connection (respx's own mock leaves a cycle of its own here).
    base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    policy = stormguard.RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.001)
    sync = stormguard.Client(base_url=base_url, api_key="sk-x", model="m", retry_policy=policy)
    asynchronous = stormguard.AsyncClient(
        base_url=base_url,
        api_key="sk-x",
        model="m",
        retry_policy=policy,
        http_backend=None if backend == "sync" else backend,
    )

    async def one() -> None:
        with contextlib.suppress(stormguard.APIConnectionError):
            if backend == "sync":
                sync.chat.completions.create(messages=MESSAGES)
            else:
                await asynchronous.chat.completions.create(messages=MESSAGES)

    try:
        assert await calls_the_collector_freed(one) == []
    finally:
        sync.close()
        await asynchronous.close()
