"""The vLLM admission middleware in process, in front of a stand-in for vLLM's app (the
same engine_client attributes the middleware reads, a word tokenizer): Responses and
embeddings requests are admitted, refused and shed as chat is, with the load headers;
what vLLM does not serve still passes admission and gets vLLM's own answer.
Real vLLM: tests/vllm/test_vllm_routes.py."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from stormguard.protocol import LOAD_HEADERS
from stormguard_server.vllm import middleware
from stormguard_server.vllm.engine_load import VllmLoadReader
from tests.server.vllm.test_costs import WordTokenizer

BLOCK = 16
# 64 blocks of 16: 1,024 tokens of KV cache, a budget of 921 at the 0.9 watermark.
BLOCKS = 64
MAX_LEN = 512


class FakeVllm:
    """The routes of vLLM serving a generation model: no /v1/embeddings. A request
    whose body has ``"hold": true`` is answered only once ``release`` is set."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.bodies: list[bytes] = []  # each request's body, byte for byte
        self.headers: list[dict[str, str]] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.engine_client = SimpleNamespace(
            vllm_config=SimpleNamespace(
                cache_config=SimpleNamespace(block_size=BLOCK, num_gpu_blocks=BLOCKS)
            ),
            model_config=SimpleNamespace(max_model_len=MAX_LEN),
            errored=False,
            get_tokenizer=WordTokenizer,
        )
        self.app = Starlette(
            routes=[
                Route(path, self.answer, methods=["POST"])
                for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses")
            ]
        )
        self.app.state.engine_client = self.engine_client

    async def answer(self, request: Request) -> Response:
        self.bodies.append(await request.body())
        body = await request.json()
        self.seen.append((request.url.path, body))
        self.headers.append(dict(request.headers))
        if body.get("hold"):
            self.holding.set()
            await self.release.wait()
        return JSONResponse({"served": request.url.path})


Served = tuple[FakeVllm, httpx.AsyncClient]


@pytest.fixture
async def vllm(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.setenv(middleware.ENV_ADMISSION, json.dumps({"max_queue_requests": 1}))
    # The live gauges are vLLM's metrics registry; none here.
    monkeypatch.setattr(
        middleware, "VllmLoadReader", functools.partial(VllmLoadReader, snapshot=list)
    )
    fake = FakeVllm()
    admission = middleware.StormguardAdmission(fake.app)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = fake.app  # as Starlette sets it before its middleware stack
        await admission(scope, receive, send)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
        yield fake, client
    if admission._ticker is not None:
        admission._ticker.cancel()


def load_of(response: httpx.Response) -> dict[str, str]:
    assert all(name in response.headers for name in LOAD_HEADERS), response.headers
    return {name: response.headers[name] for name in LOAD_HEADERS}


async def test_responses_and_embeddings_are_admitted_with_load_headers(
    vllm: Served,
) -> None:
    fake, client = vllm
    served = await client.post("/v1/responses", json={"input": "a b", "max_output_tokens": 8})
    assert served.status_code == 200 and served.json() == {"served": "/v1/responses"}
    assert load_of(served)["x-token-capacity"] == str(int(BLOCK * BLOCKS * 0.9))
    streamed = await client.post(
        "/v1/responses",
        json={"input": [{"role": "user", "content": "a"}], "stream": True, "max_output_tokens": 4},
    )
    assert streamed.status_code == 200
    load_of(streamed)
    # vLLM serving a generation model has no /v1/embeddings: its own 404, our headers.
    missing = await client.post("/v1/embeddings", json={"input": ["a b", "c"]})
    assert missing.status_code == 404
    load_of(missing)
    assert [path for path, _ in fake.seen] == ["/v1/responses", "/v1/responses"]


async def test_a_held_request_shows_its_cost_in_the_load_headers(
    vllm: Served,
) -> None:
    """The cost counted is the reference server's: template tokens + max_output_tokens,
    in whole KV blocks; the inputs' tokens alone for embeddings."""
    fake, client = vllm
    held = asyncio.ensure_future(
        client.post(
            "/v1/responses",
            json={"input": "a b c", "instructions": "x", "max_output_tokens": 40, "hold": True},
        )
    )
    await fake.holding.wait()
    # (2 + 1) + (2 + 3) + 2 = 10 prompt tokens + 40 = 50: four blocks of 16.
    idle = await client.get("/v1/models")  # not admitted: the load as it is
    assert load_of(idle)["x-inflight-tokens"] == "64"
    # 40 words + BOS = 41 tokens, no output: three blocks, in flight while it answers.
    probe = await client.post("/v1/embeddings", json={"input": "w " * 40})
    assert probe.status_code == 404
    assert load_of(probe)["x-inflight-tokens"] == str(64 + 48)
    fake.release.set()
    assert (await held).status_code == 200


async def test_too_long_responses_and_embeddings_are_refused_before_vllm(
    vllm: Served,
) -> None:
    fake, client = vllm
    responses = await client.post(
        "/v1/responses", json={"input": "a b c", "max_output_tokens": MAX_LEN}
    )
    embeddings = await client.post("/v1/embeddings", json={"input": ["a", "w " * MAX_LEN]})
    for refused in (responses, embeddings):
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "input"
        assert refused.headers["x-load-shed"] == "too_long"
        assert refused.headers["x-should-retry"] == "false"
        load_of(refused)
    assert "in input 1" in embeddings.json()["error"]["message"]
    assert fake.seen == []


async def test_a_flood_of_responses_and_embeddings_is_shed_with_retry_after(
    vllm: Served,
) -> None:
    """One request holds 512 of the 921 tokens of budget; the queue holds one more; the
    rest (464 tokens each) are shed (503, queue_full, Retry-After) and never reach vLLM."""
    fake, client = vllm
    held = asyncio.ensure_future(
        client.post("/v1/responses", json={"input": "a", "max_output_tokens": 500, "hold": True})
    )
    await fake.holding.wait()
    big = {"input": "w " * 450}
    queued = asyncio.ensure_future(client.post("/v1/embeddings", json=big))
    while True:  # the queue holds it (a condition, not a sleep)
        probe = await client.get("/v1/models")
        if load_of(probe)["x-queue-depth"] == "1":
            break
        await asyncio.sleep(0)
    shed = [
        await client.post("/v1/embeddings", json=big),
        await client.post("/v1/responses", json={"input": "a", "max_output_tokens": 450}),
        await client.post(
            "/v1/responses", json={"input": "a", "max_output_tokens": 450, "stream": True}
        ),
    ]
    for refused in shed:
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "queue_full"
        assert refused.headers["x-load-shed"] == "queue_full"
        assert float(refused.headers["retry-after-ms"]) > 0
        assert load_of(refused)["x-queue-depth"] == "1"
    fake.release.set()
    assert (await held).status_code == 200
    # Admitted once the held request left: vLLM's own answer (no such route).
    assert (await queued).status_code == 404
    assert [path for path, _ in fake.seen] == ["/v1/responses"]


async def test_a_body_over_the_limit_is_413(vllm: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, client = vllm
    monkeypatch.setattr(middleware, "_MAX_BODY_BYTES", 1000)
    for path in ("/v1/embeddings", "/v1/responses"):
        refused = await client.post(path, json={"input": "x" * 2000})
        assert refused.status_code == 413
        load_of(refused)
    assert fake.seen == []


async def test_shapes_not_counted_go_to_vllm_unadmitted(
    vllm: Served,
) -> None:
    fake, client = vllm
    tool_output = {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}
    answered = await client.post("/v1/responses", json=tool_output)
    assert answered.status_code == 200
    load_of(answered)
    assert fake.seen == [("/v1/responses", tool_output)]


TOOLS_AND_FORMATS = [
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "use get_weather"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                        },
                        "strict": True,
                    },
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "A", "schema": {"type": "object"}, "strict": True},
            },
            "max_tokens": 8,
        },
    ),
    (
        "/v1/responses",
        {
            "input": [
                {"role": "user", "content": "use f"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "x"},
            ],
            "tools": [{"type": "function", "name": "f", "parameters": None, "strict": False}],
            "tool_choice": "required",
            "text": {"format": {"type": "json_schema", "name": "A", "schema": {"type": "object"}}},
            "max_output_tokens": 8,
        },
    ),
    (
        "/v1/responses",
        {
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "text": {"format": {"type": "json_object"}},
            "max_output_tokens": 8,
        },
    ),
]


@pytest.mark.parametrize(("path", "request_"), TOOLS_AND_FORMATS)
async def test_tools_and_formats_reach_vllm_byte_for_byte(
    vllm: Served, path: str, request_: dict[str, Any]
) -> None:
    """The middleware reads the body to count it, and hands vLLM the very bytes it was
    sent: vLLM's own tool parser and guided decoding read them."""
    fake, client = vllm
    # Spacing and key order json.dumps would not reproduce: a re-encoded body would differ.
    raw = json.dumps(request_, indent=1, sort_keys=True).encode() + b"\n  "
    answered = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert answered.status_code == 200
    load_of(answered)
    assert fake.bodies == [raw]


async def test_refusals_are_the_reference_servers(
    vllm: Served, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In front of vLLM or in the reference server, a body over the limit and a request
    that can never fit are refused by the same functions: the same status, error
    fields and refusal headers (only the token counts in a message differ)."""
    _, client = vllm
    monkeypatch.setattr(middleware, "_MAX_BODY_BYTES", 1000)
    async with make_client(max_body_bytes=1000, max_model_len=MAX_LEN) as reference:
        big = {"model": "stormguard-sim", "input": "x" * 2000}
        ours, theirs = (
            await client.post("/v1/responses", json=big),
            await reference.post("/v1/responses", json=big),
        )
        assert ours.status_code == theirs.status_code == 413
        assert ours.json() == theirs.json()
        long = {"model": "stormguard-sim", "input": "a b c", "max_output_tokens": 4 * MAX_LEN}
        ours, theirs = (
            await client.post("/v1/responses", json=long),
            await reference.post("/v1/responses", json=long),
        )
        assert ours.status_code == theirs.status_code == 400
        fields = ("type", "code", "param")
        assert [ours.json()["error"][k] for k in fields] == [
            theirs.json()["error"][k] for k in fields
        ]
        for header in ("x-load-shed", "x-should-retry"):
            assert ours.headers[header] == theirs.headers[header]


@pytest.mark.parametrize(
    ("client", "token", "believed"),
    [
        ("127.0.0.1", None, True),  # loopback: trusted unless told otherwise
        ("203.0.113.7", None, False),
        ("203.0.113.7", "a-token-of-16-chars", True),
        ("203.0.113.7", "not-the-right-token", False),
    ],
)
async def test_critical_is_believed_only_from_trusted_callers(
    monkeypatch: pytest.MonkeyPatch, client: str, token: str | None, believed: bool
) -> None:
    monkeypatch.setenv("STORMGUARD_PRIORITY_TOKEN", "a-token-of-16-chars")
    monkeypatch.delenv("STORMGUARD_TRUST_PRIORITY_FROM", raising=False)
    monkeypatch.setattr(
        middleware, "VllmLoadReader", functools.partial(VllmLoadReader, snapshot=list)
    )
    fake = FakeVllm()
    admission = middleware.StormguardAdmission(fake.app)
    tickets: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = fake.app
        await admission(scope, receive, send)

    headers = {"x-priority": "critical"}
    if token is not None:
        headers["x-priority-token"] = token
    transport = httpx.ASGITransport(app=app, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as http:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        first = await http.post("/v1/completions", json=body)  # sets the controller up
        assert admission._controller is not None
        make_ticket = admission._controller.make_ticket

        def recorded(*args: Any, **kwargs: Any) -> Any:
            tickets.append(make_ticket(*args, **kwargs))
            return tickets[-1]

        monkeypatch.setattr(admission._controller, "make_ticket", recorded)
        answer = await http.post("/v1/completions", json=body, headers=headers)
    if admission._ticker is not None:
        admission._ticker.cancel()
    assert (first.status_code, answer.status_code) == (200, 200)
    assert tickets[0].priority.value == ("critical" if believed else "standard")
    assert admission.priority_claims_ignored == (0 if believed else 1)
    assert "x-priority-token" not in fake.headers[-1]  # vLLM never sees the token
