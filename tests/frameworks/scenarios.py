"""What every framework test runs against: the reference server, the failures, and
what stormguard alone sends for each failure.

A framework takes stormguard in one of two ways (``WAYS``): openai's client with
``http_client=stormguard.httpx_client(...)`` (``async_httpx_client``), or a stormguard
client itself (``stormguard.OpenAI``/``AsyncOpenAI``, openai's clients over
stormguard's pipeline). Each test module builds its framework both ways, and checks a
plain call, a stream, an async call, a tool call and structured output against the
reference server, and a 500, a refused connection, a crash after the first chunk and
a shed with Retry-After against a hostile server: what the framework raised, and that
the server saw no more requests for the failing call than stormguard alone sends, with
the framework and openai-python at their default retries (where a framework's own
retry loop sits above openai's client, the setting docs/frameworks.md names). Where
nothing listens, the requests are the connections tried: the attempts of the
stormguard clients the test built (``tracked``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

import stormguard
from stormguard._transport.transport import pipeline_of
from tests.e2e.hostile_server import HEAD_SSE, Behaviour, HostileServer, RawRequest, answer
from tests.e2e.server_process import RunningServer, free_port, run_server

__all__ = [
    "FAULTS",
    "FIRST_CHUNK",
    "KEY",
    "MODEL",
    "WAYS",
    "Fault",
    "Person",
    "add",
    "alone",
    "failing",
    "reference_server",
    "tracked",
]

#: The model name the frameworks ask for: an alias of the reference server's model
#: (frameworks know gpt-4o's profile: tools, structured output).
MODEL = "gpt-4o"
KEY = "sk-frameworks-test-key"
WAYS = ("http_client", "stormguard_client")
#: The APIs a failing server fails (chat completions, the Responses API).
PATHS = ("/v1/chat/completions", "/v1/responses")


class Person(BaseModel):
    """The structured output every framework asks for."""

    name: str
    age: int


def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@contextmanager
def reference_server() -> Iterator[RunningServer]:
    """The reference server, serving ``MODEL``. A request without ``max_tokens`` asks
    for the whole window: a KV cache four windows large admits it, and answers of 16
    tokens keep each call short."""
    args = ("--model-alias", MODEL, "--num-kv-blocks", "512", "--natural-output-tokens", "16")
    with run_server(*args) as server:
        yield server


#: What a crash after the first chunk sent before it: text, and the start of a JSON
#: document too (for a framework that parses a structured answer as it comes).
FIRST_CHUNK = '{"name": "Al'


def _chunk(content: str) -> bytes:
    body = {
        "id": "chatcmpl-crash",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def crash_after_first_chunk() -> Behaviour:
    """An engine that crashed after its first chunk: the connection closes there."""

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD_SSE + _chunk(FIRST_CHUNK))
        await writer.drain()
        writer.close()

    return behaviour


_ERROR = {"error": {"message": "the engine failed", "type": "server_error"}}
_SHED = {"error": {"message": "overloaded: retry later", "type": "server_error"}}


@dataclass(frozen=True)
class Fault:
    """A failure the server answers every request with; ``stream``: the call streams."""

    name: str
    behaviour: Callable[[], Behaviour]
    stream: bool = False


FAULTS = {
    "500": Fault("500", lambda: answer(500, _ERROR)),
    "shed": Fault(
        "shed",
        lambda: answer(
            503,
            _SHED,
            [("retry-after", "1"), ("retry-after-ms", "100"), ("x-load-shed", "queue_full")],
        ),
    ),
    "crash": Fault("crash", crash_after_first_chunk, stream=True),
}


Pipeline = stormguard.Client | stormguard.AsyncClient


@dataclass
class Failing:
    """A hostile server answering every call with a fault, or no server at all."""

    base_url: str
    server: HostileServer | None
    started: float
    #: The stormguard clients built while it was the target (``tracked``).
    pipelines: list[Pipeline] = field(default_factory=list)

    @property
    def requests(self) -> int:
        """The requests the server has seen (the calls', to any API); where nothing
        listens, the connections the stormguard clients built for it tried."""
        if self.server is None:
            return sum(pipeline.stats().attempts for pipeline in self.pipelines)
        return len(self.server.requests)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


#: The failing targets entered and not left yet, the innermost last.
_targets: list[Failing] = []

C = TypeVar("C")


def tracked(client: C) -> C:
    """``client`` (a stormguard client, an HTTP client of ``stormguard.httpx_client()``,
    or a ``stormguard.OpenAI``), its pipeline counted in the current failing target's
    ``requests``."""
    pipeline: object = client
    if not isinstance(client, (stormguard.Client, stormguard.AsyncClient)):
        pipeline = getattr(client, "stormguard", None) or pipeline_of(client)
    assert isinstance(pipeline, (stormguard.Client, stormguard.AsyncClient)), client
    if _targets:
        _targets[-1].pipelines.append(pipeline)
    return client


@contextmanager
def failing(fault: str) -> Iterator[Failing]:
    """A base URL whose server fails every call with ``fault`` (``FAULTS``), or, for
    ``"refused"``, one where nothing listens."""
    with ExitStack() as stack:
        if fault == "refused":
            target = Failing(f"http://127.0.0.1:{free_port()}/v1", None, time.monotonic())
        else:
            server = HostileServer({path: FAULTS[fault].behaviour() for path in PATHS})
            stack.enter_context(server)
            target = Failing(server.base_url, server, time.monotonic())
        _targets.append(target)
        try:
            yield target
        finally:
            _targets.remove(target)


_alone: dict[str, int] = {}


def alone(fault: str) -> int:
    """The requests stormguard alone (``stormguard.Client``, its defaults) sends for one
    call that meets ``fault``: what the server may see through a framework."""
    if fault not in _alone:
        stream = fault in FAULTS and FAULTS[fault].stream
        with failing(fault) as target, tracked(stormguard.Client(base_url=target.base_url)) as sg:
            with pytest.raises(stormguard.StormguardError):
                created: Any = sg.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=stream,
                )
                for _ in created if stream else ():
                    pass
            _alone[fault] = target.requests
    return _alone[fault]
