"""RequestLimits: requests served at once and their body bytes, refused past either."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from stormguard.testing import FakeClock
from stormguard_server.http.middleware import declared_content_length
from stormguard_server.http.request_limits import RequestLimits, RequestLimitsConfig

Headers = list[tuple[bytes, bytes]]


class Blocking:
    """An app that holds every request until ``release`` is set (or raises if told to)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrivals: asyncio.Queue[Scope] = asyncio.Queue()
        self.fail = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.arrivals.put_nowait(scope)
        await self.release.wait()
        if self.fail:
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, headers: Headers | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request through ``app``: status, headers, body."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers or []}
    await app(scope, receive, send)
    start = sent[0]
    return (
        start["status"],
        {k.decode(): v.decode() for k, v in start["headers"]},
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


def limits(
    app: Any, clock: FakeClock | None = None, shed_headers: bool = True, **config: Any
) -> RequestLimits:
    settings: dict[str, Any] = {
        "max_requests": 2,
        "max_body_bytes_held": 1000,
        "max_body_bytes": 600,
        "min_retry_after_s": 0.05,
        "max_retry_after_s": 30.0,
        "rate_period_s": 5.0,
        **config,
    }
    return RequestLimits(
        app,
        RequestLimitsConfig(**settings),
        load_headers=lambda: {"x-queue-depth": "7"},
        shed_headers=shed_headers,
        clock=(clock or FakeClock()).now,
    )


def length(n: int) -> Headers:
    return [(b"content-length", str(n).encode())]


async def started(app: Blocking, gate: RequestLimits, *headers: Headers) -> list[asyncio.Task[Any]]:
    """Requests that the gate let in and the app now holds."""
    tasks = [asyncio.create_task(call(gate, h)) for h in headers]
    for _ in headers:
        await app.arrivals.get()
    return tasks


async def test_past_the_request_limit_an_openai_503_with_retry_after_and_load_headers() -> None:
    app = Blocking()
    gate = limits(app)
    held = await started(app, gate, [], [])
    status, headers, body = await call(gate)
    assert status == 503
    error = json.loads(body)["error"]
    assert error["code"] == "queue_full"
    assert error["type"] == "service_unavailable"
    assert "limit of 2 requests" in error["message"]
    assert headers["retry-after"] == "1"  # nothing measured yet: 1 s, as admission says
    assert headers["x-load-shed"] == "queue_full"
    assert headers["x-should-retry"] == "true"
    assert headers["x-queue-depth"] == "7"
    assert headers["connection"] == "close"
    app.release.set()
    assert [(await t)[0] for t in held] == [200, 200]
    assert gate.requests.held == 0
    assert (await call(gate))[0] == 200


async def test_retry_after_comes_from_the_rate_requests_finish_at() -> None:
    clock = FakeClock()
    app = Blocking()
    app.release.set()
    gate = limits(app, clock, max_requests=1)
    for _ in range(10):  # 10 requests finish over 5 s: 2 per second
        await call(gate)
        await app.arrivals.get()
        clock.advance(0.5)
    app.release.clear()
    held = await started(app, gate, [])
    _, headers, _ = await call(gate)
    assert headers["retry-after-ms"] == "500"  # one place frees in 1 / (2 per s)
    app.release.set()
    await held[0]


async def test_the_first_release_is_measured_from_when_requests_were_first_taken() -> None:
    """One request that took 4 s to finish is 0.25 per second, not ten (a span
    floored at 0.1 s from its own release): the first refusals' Retry-After is not
    too short by the request's whole duration."""
    clock = FakeClock()
    app = Blocking()
    gate = limits(app, clock, max_requests=1)
    first = await started(app, gate, [])
    clock.advance(4.0)
    app.release.set()
    await first[0]
    app.release.clear()
    held = await started(app, gate, [])
    _, headers, _ = await call(gate)
    assert headers["retry-after"] == "4"  # one place frees in 1 / (0.25 per s)
    app.release.set()
    await held[0]


async def test_body_bytes_are_held_from_the_content_length_and_given_back() -> None:
    app = Blocking()
    gate = limits(app, max_requests=10)
    held = await started(app, gate, length(500), length(400))
    assert gate.body_bytes.held == 900
    status, _, body = await call(gate, length(200))
    assert status == 503
    assert "1000 bytes of request bodies" in json.loads(body)["error"]["message"]
    assert gate.requests.held == 2  # the refused one holds nothing
    small = await started(app, gate, length(100))  # still fits
    app.release.set()
    assert [(await t)[0] for t in [*held, *small]] == [200, 200, 200]
    assert gate.body_bytes.held == 0


async def test_a_chunked_body_holds_the_body_size_limit_and_a_huge_length_is_capped() -> None:
    app = Blocking()
    gate = limits(app, max_requests=10, max_body_bytes_held=1200)
    held = await started(app, gate, [(b"transfer-encoding", b"chunked")], length(10**12))
    assert gate.body_bytes.held == 1200  # 600 each: the per-request limit
    app.release.set()
    for task in held:
        await task


async def test_what_a_failed_request_held_is_given_back() -> None:
    app = Blocking()
    app.fail = True
    app.release.set()
    gate = limits(app)
    with pytest.raises(RuntimeError):
        await call(gate, length(300))
    assert (gate.requests.held, gate.body_bytes.held) == (0, 0)


async def test_without_admission_the_refusal_has_retry_after_but_no_stormguard_headers() -> None:
    app = Blocking()
    gate = limits(app, shed_headers=False, max_requests=1)
    held = await started(app, gate, [])
    status, headers, _ = await call(gate)
    assert status == 503
    assert headers["retry-after"] == "1"
    assert "x-load-shed" not in headers and "x-queue-depth" not in headers
    app.release.set()
    await held[0]


async def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    gate = limits(app, max_requests=1)
    await gate({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


def test_a_budget_smaller_than_one_body_is_refused() -> None:
    with pytest.raises(ValueError, match="at least max_body_bytes"):
        RequestLimitsConfig(max_requests=1, max_body_bytes_held=10, max_body_bytes=20)
    with pytest.raises(ValueError, match="max_requests"):
        RequestLimitsConfig(max_requests=0, max_body_bytes_held=10, max_body_bytes=10)


@pytest.mark.parametrize("value", [b"", b"-5", b"1e3", b"\xff", b"9" * 40])
async def test_a_length_that_is_not_a_number_holds_the_body_size_limit(value: bytes) -> None:
    """h11 refuses these before the app; mounted under another server, they must not
    raise here (a 500) nor hold nothing."""
    app = Blocking()
    gate = limits(app, max_requests=10, max_body_bytes_held=1200)
    held = await started(app, gate, [(b"Content-Length", value)])
    assert gate.body_bytes.held == 600
    app.release.set()
    assert (await held[0])[0] == 200


@pytest.mark.parametrize("declared", [b"\xb9", b"\xb2\xb3", b"12\xb9"])
def test_a_content_length_of_other_digits_is_no_number(declared: bytes) -> None:
    """``¹``, ``²³`` (latin-1 0xb9, 0xb2 0xb3) are digits to ``str.isdigit`` but no
    number to ``int()``: no Content-Length, not a ValueError."""
    scope = {"type": "http", "headers": [(b"content-length", declared)]}
    assert declared_content_length(scope) is None


async def test_a_request_with_such_a_content_length_is_answered() -> None:
    app = Blocking()
    app.release.set()
    status, _, _ = await call(limits(app), [(b"content-length", b"\xb9")])
    assert status == 200
