"""POST /v1/embeddings in process: openai's request and response shapes, deterministic
unit vectors, admission at the inputs' token count, a prefill that leaves no KV
blocks behind, openai's 400s, and the deadline and shed paths the chat route has."""

from __future__ import annotations

import array
import base64
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stormguard.protocol import LOAD_HEADERS
from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, ServerConfig
from stormguard_server.state import ServerState
from stormguard_server.telemetry.records import RequestRecord
from tests.server.conftest import FAST_ENGINE
from tests.server.fake_clock import FakeClock
from tests.server.test_app import assert_openai_error

EMBEDDINGS = "/v1/embeddings"
DIMENSIONS = 64


class Records:
    """An observer that keeps every finished request's record."""

    def __init__(self) -> None:
        self.done: list[RequestRecord] = []

    def request_arrived(self, record: RequestRecord) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        self.done.append(record)


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, ServerState, Records]]:
    config = ServerConfig(engine=FAST_ENGINE, embedding_dimensions=DIMENSIONS)
    state = build_state(config)
    records = Records()
    state.observers.append(records)
    app = create_app(state=state)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client, state, records


def vectors(response: httpx.Response) -> list[list[float]]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    assert all(item["object"] == "embedding" for item in body["data"])
    out: list[list[float]] = []
    for item in body["data"]:
        value = item["embedding"]
        if isinstance(value, str):
            value = array.array("f", base64.b64decode(value)).tolist()
        out.append(value)
    return out


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def count(client: httpx.AsyncClient, text: str) -> int:
    tokenized = await client.post("/tokenize", json={"prompt": text})
    return int(tokenized.json()["count"])


async def test_openai_shape_unit_vectors_and_usage(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, _, _ = served
    texts = ["the storm passes", "a queue that stays short"]
    response = await client.post(
        EMBEDDINGS, json={"model": "stormguard-sim", "input": texts, "user": "u-1"}
    )
    one, two = vectors(response)
    body = response.json()
    assert body["model"] == "stormguard-sim"
    tokens = sum([await count(client, t) for t in texts])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert len(one) == len(two) == DIMENSIONS
    assert math.isclose(dot(one, one), 1.0, rel_tol=1e-5)
    assert abs(dot(one, two)) < 0.9  # different texts, different directions
    assert response.headers["x-request-id"].startswith("embd-")
    for name in LOAD_HEADERS:
        assert name in response.headers


async def test_same_input_same_vector_in_any_format_and_position(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, _, _ = served
    [alone] = vectors(await client.post(EMBEDDINGS, json={"input": "same words"}))
    _, second = vectors(await client.post(EMBEDDINGS, json={"input": ["other", "same words"]}))
    [encoded] = vectors(
        await client.post(EMBEDDINGS, json={"input": "same words", "encoding_format": "base64"})
    )
    assert alone == second == encoded  # float32 values, bit for bit


async def test_dimensions_shorten_the_same_direction(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, _, _ = served
    [full] = vectors(await client.post(EMBEDDINGS, json={"input": "words"}))
    [short] = vectors(await client.post(EMBEDDINGS, json={"input": "words", "dimensions": 16}))
    assert len(short) == 16
    assert math.isclose(dot(short, short), 1.0, rel_tol=1e-5)
    scale = math.sqrt(dot(full[:16], full[:16]))
    assert all(
        math.isclose(s * scale, f, abs_tol=1e-6) for s, f in zip(short, full[:16], strict=True)
    )
    error = assert_openai_error(
        await client.post(EMBEDDINGS, json={"input": "words", "dimensions": DIMENSIONS + 1}), 400
    )
    assert error["param"] == "dimensions"


async def test_token_id_inputs(served: tuple[httpx.AsyncClient, ServerState, Records]) -> None:
    client, _, _ = served
    flat = await client.post(EMBEDDINGS, json={"input": [5, 6, 7]})
    assert len(vectors(flat)) == 1
    assert flat.json()["usage"]["prompt_tokens"] == 3
    nested = await client.post(EMBEDDINGS, json={"input": [[5, 6, 7], [9]]})
    first, _ = vectors(nested)
    assert nested.json()["usage"]["prompt_tokens"] == 4
    assert first == vectors(flat)[0]


async def test_admitted_at_the_token_count_and_no_kv_left_behind(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, state, records = served
    texts = ["word " * 100, "word " * 150]
    computed_before = state.engine.stats.prompt_tokens_computed
    response = await client.post(EMBEDDINGS, json={"input": texts})
    tokens = response.json()["usage"]["prompt_tokens"]
    [record] = [r for r in records.done if r.kind == "embedding"]
    assert record.outcome == "ok"
    assert record.prompt_tokens == tokens and record.max_tokens == 0
    assert record.output_tokens == 0  # the token sampled at the prefill's end is dropped
    assert record.cost == -(-tokens // FAST_ENGINE.block_size) * FAST_ENGINE.block_size
    # The engine ran the prefill of exactly those tokens, and nothing holds KV after it.
    assert state.engine.stats.prompt_tokens_computed - computed_before == tokens
    load = state.engine.load()
    assert load.kv_cache_usage == 0.0 and load.running == 0 and load.waiting == 0
    assert state.admission is not None and state.admission.inflight_tokens == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [[1], []]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": [2**40]}, "input"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": 5}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "stormguard-sim"}, "input"),
    ],
)
async def test_bad_input_is_an_openai_400(
    served: tuple[httpx.AsyncClient, ServerState, Records], body: Any, param: str
) -> None:
    client, _, _ = served
    error = assert_openai_error(await client.post(EMBEDDINGS, json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param)


async def test_an_input_over_the_context_is_too_long_as_for_chat(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, _, _ = served
    response = await client.post(EMBEDDINGS, json={"input": ["short", "x " * 600]})
    error = assert_openai_error(response, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert "input 1" in error["message"]
    assert response.headers["x-load-shed"] == "too_long"
    assert response.headers["x-should-retry"] == "false"


async def test_inputs_that_fit_alone_but_not_together_are_refused_whole(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    """Admission takes the request's whole cost: two inputs of 480 tokens each fit the
    context but not the token budget (921) together."""
    client, _, _ = served
    response = await client.post(EMBEDDINGS, json={"input": ["x " * 480, "y " * 480]})
    assert_openai_error(response, 400)
    assert response.headers["x-load-shed"] == "too_long"


async def test_unknown_model_is_404(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, _, _ = served
    error = assert_openai_error(
        await client.post(EMBEDDINGS, json={"model": "gpt-9", "input": "x"}), 404
    )
    assert error["code"] == "model_not_found"


async def test_a_passed_deadline_is_shed_before_the_engine(
    served: tuple[httpx.AsyncClient, ServerState, Records],
) -> None:
    client, state, _ = served
    started = state.engine.stats.requests_started
    response = await client.post(
        EMBEDDINGS, json={"input": "x"}, headers={"x-request-deadline-ms": "0"}
    )
    assert_openai_error(response, 503)
    assert response.headers["x-load-shed"] == "deadline"
    assert state.engine.stats.requests_started == started


async def test_a_deadline_that_passes_in_the_engine_is_a_504() -> None:
    """The engine is frozen with the request in it; its deadline passes there."""
    config = ServerConfig(engine=FAST_ENGINE, admission=AdmissionConfig(enabled=True))
    clock = FakeClock()
    state = build_state(config, clock=clock)
    app = create_app(state=state)
    await clock.drive(state.engine.start())  # warm-up on the fake clock
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            assert state.faults is not None
            state.faults.stall(600)  # no step runs until the deadline has passed
            started = state.engine.stats.requests_started
            call = client.post(
                EMBEDDINGS, json={"input": "x"}, headers={"x-request-deadline-ms": "300"}
            )
            start = clock.now()
            response = await clock.drive(call)
            assert clock.now() - start == pytest.approx(0.3, abs=0.05)  # the stall is polled
            state.faults.stall(0)
            error = assert_openai_error(response, 504)
            assert error["code"] == "deadline_exceeded"
            assert state.engine.stats.requests_started == started + 1
            assert state.engine.stats.requests_deadline_exceeded == 1
            assert state.engine.load().kv_cache_usage == 0.0
