"""A small misbehaving OpenAI-style server for end-to-end tests of the SDK.

Runs a Starlette app under uvicorn in a thread, on 127.0.0.1 and a free port.
Its behaviour (error rate, outage, delay, stream pacing) is a mutable
``Behaviour`` the test changes between phases; it counts what it saw
(requests, attempt numbers, stream disconnects) so tests can assert on the
server's side of the wire.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Behaviour:
    error_rate: float = 0.0
    outage: bool = False
    retry_after_ms: int | None = 20
    delay: float = 0.0
    stream_chunks: int = 3
    stream_interval: float = 0.0
    seed: int = 1234


@dataclass
class Seen:
    requests: int = 0
    attempts: Counter[int] = field(default_factory=Counter)
    streams_started: int = 0
    streams_finished: int = 0
    streams_disconnected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _completion(model: str) -> dict[str, object]:
    return {
        "id": "cmpl-e2e",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "pong"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


class FlakyServer:
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.seen = Seen()
        self._rng = random.Random(self.behaviour.seed)
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]})

    def reset(self, **behaviour: object) -> None:
        self.behaviour = Behaviour(**behaviour)  # type: ignore[arg-type]
        self._rng = random.Random(self.behaviour.seed)
        self.seen = Seen()

    def __enter__(self) -> FlakyServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("flaky server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def _note(self, request: Request) -> None:
        with self.seen.lock:
            self.seen.requests += 1
            attempt = request.headers.get("x-stormguard-attempt", "0")
            self.seen.attempts[int(attempt) if attempt.isdigit() else 0] += 1

    def _fails(self) -> bool:
        b = self.behaviour
        return b.error_rate > 0 and self._rng.random() < b.error_rate

    def _down(self) -> Response:
        """An outage, as a gateway in front of a dead backend answers: a crash-like 502
        (the breaker's business), where ``_busy`` is a shed ("alive, but full")."""
        headers = {}
        if self.behaviour.retry_after_ms is not None:
            headers["retry-after-ms"] = str(self.behaviour.retry_after_ms)
        return JSONResponse(
            {"error": {"message": "upstream unavailable", "type": "server_error"}}, 502, headers
        )

    def _busy(self) -> Response:
        headers = {"x-queue-depth": "42"}
        if self.behaviour.retry_after_ms is not None:
            headers["retry-after-ms"] = str(self.behaviour.retry_after_ms)
        return JSONResponse(
            {"error": {"message": "overloaded", "type": "server_error"}}, 503, headers=headers
        )

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "e2e", "max_model_len": 4096}]})

    async def _chat(self, request: Request) -> Response:
        self._note(request)
        body = json.loads(await request.body())
        if self.behaviour.delay:
            await asyncio.sleep(self.behaviour.delay)
        if self.behaviour.outage:
            return self._down()
        if self._fails():
            return self._busy()
        if body.get("stream"):
            return StreamingResponse(self._stream(body["model"]), media_type="text/event-stream")
        return JSONResponse(_completion(body["model"]), headers={"x-queue-depth": "0"})

    async def _stream(self, model: str) -> AsyncIterator[bytes]:
        with self.seen.lock:
            self.seen.streams_started += 1
        finished = False
        try:
            for i in range(self.behaviour.stream_chunks):
                chunk = {
                    "id": "s",
                    "model": model,
                    "choices": [{"index": 0, "delta": {"content": f"t{i} "}}],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                if self.behaviour.stream_interval:
                    await asyncio.sleep(self.behaviour.stream_interval)
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            with self.seen.lock:
                if finished:
                    self.seen.streams_finished += 1
                else:
                    self.seen.streams_disconnected += 1


def wait_for(predicate: object, timeout: float = 5.0) -> bool:
    """Poll ``predicate`` (a callable) until true or ``timeout``; returns the last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return bool(predicate())  # type: ignore[operator]


def running() -> Iterator[FlakyServer]:
    with FlakyServer() as server:
        yield server
