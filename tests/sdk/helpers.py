"""Shared helpers of the SDK tests: a sync/async client builder and canned responses."""

from __future__ import annotations

import inspect
import json
from typing import Any

import httpx

import stormguard
from stormguard._io.pool_life import LoopTransport, ProcessTransport
from stormguard.testing import FakeClock

BASE = "http://llm.test/v1"


def unreachable(host: str, port: int, timeout: float) -> bool:
    """A connect check that makes no connection: the test hosts do not exist."""
    return False


class Api:
    """Builds a sync or async client and awaits its results uniformly."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.clock = FakeClock()
        self._clients: list[Any] = []

    def client(self, **kwargs: Any) -> Any:
        kwargs.setdefault("base_url", BASE)
        kwargs.setdefault("model", "m")
        kwargs.setdefault("api_key", "sk-test-secret-key")
        kwargs.setdefault("clock", self.clock)
        # A roomy budget, so that tests about other things are not cut short by it.
        kwargs.setdefault(
            "retry_budget",
            stormguard.RetryBudget(ratio=1.0, min_retries_per_second=10, clock=self.clock),
        )
        # No connect check leaves the process: an unreachable endpoint stays out.
        kwargs.setdefault("ejection", stormguard.EjectionConfig(probe=unreachable))
        cls = stormguard.Client if self.mode == "sync" else stormguard.AsyncClient
        client = cls(**kwargs)
        self._clients.append(client)
        return client

    async def run(self, value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    async def collect(self, stream: Any) -> list[Any]:
        if self.mode == "sync":
            return list(stream)
        return [chunk async for chunk in stream]

    async def collect_into(self, stream: Any, got: list[Any]) -> None:
        """Read ``stream`` into ``got`` as it comes: what came before an error stays."""
        if self.mode == "sync":
            got.extend(stream)
        else:
            async for chunk in stream:
                got.append(chunk)

    async def close_all(self) -> None:
        for client in self._clients:
            await self.run(client.close())


def chat_json(content: str = "hello", **extra: Any) -> dict[str, Any]:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    body.update(extra)
    return body


def sse(*events: str, done: bool = True) -> bytes:
    out = "".join(f"data: {event}\n\n" for event in events)
    if done:
        out += "data: [DONE]\n\n"
    return out.encode()


def chunk(content: str, **extra: Any) -> str:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    body.update(extra)
    return json.dumps(body)


def event_stream(body: bytes, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, headers={"content-type": "text/event-stream", **headers}, content=body
    )


MESSAGES = [{"role": "user", "content": "hi"}]


def local(transport: Any) -> Any:
    """The transport a transport of the client's own pool stands for in this process
    (and event loop: ``_io/pool_life.py``); any other as it is."""
    own = isinstance(transport, (ProcessTransport, LoopTransport))
    return transport.transport if own else transport


def own_pools(client: stormguard.Client | stormguard.AsyncClient) -> list[Any]:
    """The httpx transports of a client's own pool: each of its shards'
    (``_io/pool_shards.py``), or its one when its limits fit one."""
    transport: Any = local(client._http._transport)
    return [shard.transport for shard in getattr(transport, "shards", ())] or [transport]
