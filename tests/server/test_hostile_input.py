"""Property: whatever text is in a request, the server answers it: a success or an
OpenAI-shaped error, never a 500, never a hang.

Arbitrary unicode, lone surrogates included, goes in every string field of every
route's body (chat, completions and the Responses API, streamed or not, embeddings,
/tokenize), in the model id of
/v1/models/{id}, and in every request header the server reads. Requests are made at
the ASGI level with a hand-built scope: header values are raw bytes there (httpx
cannot send a header that is not latin-1). One app serves every example (tracing
on, so ``traceparent``, ``tracestate`` and ``baggage`` are parsed too); sizes are
small, so that an example takes milliseconds and the whole file a few seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, unquote

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from starlette.types import Message

from stormguard.protocol import LOAD_HEADERS
from stormguard_server.app import build_state, create_app
from stormguard_server.config import ServerConfig
from tests.server.conftest import FAST_ENGINE

# Short natural completions, so that a request without max_tokens is quick too.
ENGINE = dataclasses.replace(FAST_ENGINE, natural_output_tokens=4, warmup_probe_tokens=1)
SETTINGS = settings(
    max_examples=60,
    deadline=None,  # a busy CI machine is slow, not wrong
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Well past the slowest honest answer; a request that outlives it hangs.
ANSWER_WITHIN_S = 30.0

# Characters that broke servers before: lone surrogates (valid as JSON escapes),
# NUL, the byte order mark, a noncharacter, bidi overrides, line breaks, and the
# characters that mean something in paths, JSON and headers.
SPECIAL = [
    "\ud800",
    "\udfff",
    "\udc00\ud800",
    "\x00",
    "\ufeff",
    "\uffff",
    "\u202e",
    "\r",
    "\n",
    "/",
    "%",
    '"',
]
# Any code point (drawn from one range, in which a surrogate almost never comes up),
# or pieces of text joined with lone surrogates and SPECIAL ones: not one alphabet,
# as hypothesis would merge them into such a range.
any_text = st.text(st.characters(exclude_categories=()), max_size=16)
with_specials = st.lists(
    st.one_of(any_text, st.characters(categories=["Cs"]), st.sampled_from(SPECIAL)),
    min_size=1,
    max_size=6,
).map("".join)
hostile = st.one_of(any_text, with_specials)


def bodies(text: st.SearchStrategy[str]) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """The body of each POST route with ``text`` in every string field. A value the
    server accepts is drawn now and then, so that the text also reaches the engine,
    the stream and the observers, not only validation."""

    def plausible_or(*plausible: str) -> st.SearchStrategy[str]:
        accepted = st.sampled_from(plausible)
        return st.one_of(accepted, accepted, text)  # weighted by repetition

    model = plausible_or("stormguard-sim")
    extra_fields = st.dictionaries(text, text, max_size=2)  # unknown fields are accepted
    text_part = st.fixed_dictionaries(
        {"type": plausible_or("text"), "text": text}, optional={"extra": text}
    )
    message = st.builds(
        lambda role, content, extra: {**extra, "role": role, "content": content},
        plausible_or("user", "system", "assistant"),
        st.one_of(st.none(), text, st.lists(text_part, max_size=2)),
        extra_fields,
    )
    messages = st.lists(message, min_size=1, max_size=3)
    sampling = {
        "model": model,
        "stream": st.booleans(),
        "stop": st.one_of(st.none(), text, st.lists(plausible_or("\n", "."), max_size=3)),
        "max_tokens": st.one_of(st.none(), st.integers(1, 4)),
    }
    optional = {"stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})}

    def generation(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        return st.builds(
            lambda body, extra: {**extra, **{k: v for k, v in body.items() if v is not None}},
            st.fixed_dictionaries({**sampling, **fields}, optional=optional),
            extra_fields,
        )

    token_ids = st.lists(st.integers(-2, 2**33), max_size=3)
    input_part = st.fixed_dictionaries(
        {"type": plausible_or("input_text", "output_text"), "text": text}
    )
    input_message = st.builds(
        lambda role, content, extra: {**extra, "role": role, "content": content},
        plausible_or("user", "developer", "assistant"),
        st.one_of(text, st.lists(input_part, max_size=2)),
        extra_fields,
    )
    return {
        "/v1/chat/completions": generation(messages=messages),
        "/v1/embeddings": st.builds(
            lambda body, extra: {**extra, **body},
            st.fixed_dictionaries(
                {
                    "input": st.one_of(
                        text, st.lists(text, max_size=3), token_ids, st.lists(token_ids, max_size=2)
                    )
                },
                optional={
                    "model": model,
                    "encoding_format": plausible_or("float", "base64"),
                    "dimensions": st.integers(-1, 70),
                    "user": text,
                },
            ),
            extra_fields,
        ),
        "/v1/responses": st.builds(
            lambda body, extra: {**extra, **body},
            st.fixed_dictionaries(
                {"input": st.one_of(text, st.lists(input_message, min_size=1, max_size=3))},
                optional={
                    "model": model,
                    "instructions": text,
                    "stream": st.booleans(),
                    "max_output_tokens": st.integers(0, 4),
                    "temperature": st.floats(-1, 3),
                },
            ),
            extra_fields,
        ),
        "/v1/completions": generation(
            prompt=st.one_of(text, st.lists(text, min_size=1, max_size=1))
        ),
        "/tokenize": st.builds(
            lambda body, prompt, extra: {**extra, **prompt, **body},
            st.fixed_dictionaries(
                {}, optional={"model": model, "add_generation_prompt": st.booleans()}
            ),
            st.one_of(
                st.fixed_dictionaries({"prompt": text}),
                st.fixed_dictionaries({"messages": messages}),
                st.fixed_dictionaries({}, optional={"prompt": text, "messages": messages}),
            ),
            extra_fields,
        ),
    }


# Validation refuses a lone surrogate wherever it is, so half the bodies have none:
# those go on to the engine with every other kind of text.
_CLEAN, _HOSTILE = bodies(any_text), bodies(hostile)
BODIES = {route: st.one_of(_CLEAN[route], _HOSTILE[route]) for route in _CLEAN}


# A header's value as it could arrive: any bytes, unicode as UTF-8 (what a client
# that is not latin-1-only sends), or a value each parser was written for.
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PLAUSIBLE_HEADERS = {
    "x-priority": ["critical", "standard", "sheddable", "CRITICAL", ""],
    "x-priority-token": ["a-token-of-16-chars", "x"],
    "x-request-deadline-ms": ["0", "1", "60000", "-1", "1e309", "nan", "inf", "1_0", "٣"],
    "x-stormguard-attempt": ["1", "2", "0", "-3", "99999999999999999999", "1.5"],
    "x-stormguard-requeue": ["1", "x"],
    "x-stainless-retry-count": ["0", "3", "-1", "1e3"],
    "traceparent": [TRACEPARENT, TRACEPARENT.upper(), "00-" + "0" * 32 + "-" + "0" * 16 + "-01"],
    "tracestate": ["a=b", "=,=", "k" * 300 + "=v"],
    "baggage": ["k=v", "k=v;p", "%zz=%", "=" * 10],
    "content-type": ["application/json", "application/json; charset=latin-1", "text/plain", ""],
    "content-length": ["0", "-1", "abc", "99999999999999999999999", "18446744073709551616"],
    "host": ["testserver", ""],
    "accept": ["text/event-stream", "*/*"],
}
header_value = st.one_of(
    st.binary(max_size=40),
    hostile.map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.just(b""),
)
plausible_header = st.sampled_from(
    [(name, value.encode()) for name, values in PLAUSIBLE_HEADERS.items() for value in values]
)
# content-type decides whether the body is read as JSON at all: hostile only now and
# then, so that most bodies reach the routes.
READ_FREELY = sorted(set(PLAUSIBLE_HEADERS) - {"content-type"})
headers = st.builds(
    lambda hostile_pairs, plausible_pairs, content_type: [
        (name.encode(), value) for name, value in [*hostile_pairs, *plausible_pairs, *content_type]
    ],
    st.lists(st.tuples(st.sampled_from(READ_FREELY), header_value), max_size=6),
    st.lists(plausible_header, max_size=4),
    st.integers(0, 5).flatmap(
        lambda n: (
            st.tuples(st.just("content-type"), header_value).map(lambda p: [p])
            if n == 3  # not 0: hypothesis draws the simplest value often
            else st.just([])
        )
    ),
)


@st.composite
def encoded(draw: st.DrawFn, body: dict[str, Any]) -> bytes:
    """JSON as ASCII with escapes (every surrogate survives, and reaches the routes), or
    now and then as raw UTF-8, where a lone surrogate makes the body invalid UTF-8."""
    if draw(st.integers(0, 3)) != 2:  # not 0: hypothesis draws the simplest value often
        return json.dumps(body).encode("ascii")
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes


async def call(
    app: FastAPI, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> Answer:
    """One request through the whole ASGI app; the client stays until the answer ends.

    The path is what a server makes of ``target`` sent percent-encoded as UTF-8:
    uvicorn (and the ASGI spec) decode it as UTF-8, so a lone surrogate arrives as
    U+FFFD, never as itself."""
    raw_path = quote(target.encode("utf-8", "surrogatepass"))
    path = unquote(raw_path, errors="replace")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path.encode("ascii"),
        "query_string": b"",
        "root_path": "",
        # A drawn content-type comes first, and the first one is the one read.
        "headers": [*headers, (b"content-type", b"application/json")] if body else headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    answered = asyncio.Event()
    sent: list[Message] = []
    body_read = False

    async def receive() -> Message:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.set()

    await asyncio.wait_for(app(scope, receive, send), ANSWER_WITHIN_S)
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw = list(start.get("headers", []))
    return Answer(
        status=start["status"],
        headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw},
        raw_headers=raw,
        body=b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
    )


def assert_answered(answer: Answer, *, streamed: bool = False) -> None:
    """A success or an OpenAI-shaped error, never a 500; load headers on it either way;
    no response header that could split the response."""
    event(f"status {answer.status}")  # the spread of answers: --hypothesis-show-statistics
    assert answer.status != 500, answer.body[:500]
    assert answer.status < 500 or answer.status in {503, 504}, answer.body[:500]
    for name in LOAD_HEADERS:
        assert name in answer.headers
    for name, value in answer.raw_headers:
        assert isinstance(name, bytes) and isinstance(value, bytes)
        assert b"\r" not in value and b"\n" not in value
    if answer.status >= 400:
        error = json.loads(answer.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]
    elif answer.headers.get("content-type", "").startswith("text/event-stream"):
        assert streamed
        lines = [line for line in answer.body.splitlines() if line.startswith(b"data: ")]
        events = [line[len(b"data: ") :] for line in lines]
        if b"event: " in answer.body:  # the Responses API: named events, no [DONE]
            kinds = [json.loads(data)["type"] for data in events]
            assert kinds[0] == "response.created"
            # An engine failure is the engine's word (a deadline that passed), never a 500.
            assert kinds[-1] in {"response.completed", "response.incomplete", "response.failed"}
            return
        assert events[-1] == b"[DONE]"
        for data in events[:-1]:
            chunk = json.loads(data)
            # An error event is the engine's word (a deadline that passed), never a 500.
            assert "choices" in chunk or chunk["error"]["code"] in {503, 504}
    elif answer.headers.get("content-type", "").startswith("application/json"):
        json.loads(answer.body)


@pytest.fixture
async def app() -> AsyncIterator[FastAPI]:
    config = ServerConfig(engine=ENGINE, max_body_bytes=65_536, embedding_dimensions=64)
    served = create_app(state=build_state(config, tracer_provider=TracerProvider()))
    async with served.router.lifespan_context(served):
        yield served


@settings(SETTINGS, max_examples=120)
@given(
    data=st.data(),
    route=st.sampled_from(
        ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
    ),
    sent_headers=headers,
)
async def test_generation_routes_answer_any_text(
    app: FastAPI, data: st.DataObject, route: str, sent_headers: list[tuple[bytes, bytes]]
) -> None:
    body = data.draw(BODIES[route])
    answer = await call(app, "POST", route, sent_headers, data.draw(encoded(body)))
    assert_answered(answer, streamed=body.get("stream") is True)


@SETTINGS
@given(data=st.data(), body=BODIES["/tokenize"], sent_headers=headers)
async def test_tokenize_answers_any_text(
    app: FastAPI, data: st.DataObject, body: dict[str, Any], sent_headers: list[tuple[bytes, bytes]]
) -> None:
    answer = await call(app, "POST", "/tokenize", sent_headers, data.draw(encoded(body)))
    assert_answered(answer)


@SETTINGS
@given(model_id=hostile, sent_headers=headers)
async def test_a_model_id_in_the_path_is_answered_whatever_it_holds(
    app: FastAPI, model_id: str, sent_headers: list[tuple[bytes, bytes]]
) -> None:
    answer = await call(app, "GET", f"/v1/models/{model_id}", sent_headers)
    assert_answered(answer)
    if answer.status == 404 and "/" not in model_id:  # the unknown id is echoed
        message = json.loads(answer.body)["error"]["message"]
        as_decoded = model_id.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        assert as_decoded in message


@SETTINGS
@given(
    path=st.sampled_from(["/v1/models", "/health", "/ready", "/metrics", "/nowhere"]),
    sent_headers=headers,
)
async def test_other_routes_answer_any_headers(
    app: FastAPI, path: str, sent_headers: list[tuple[bytes, bytes]]
) -> None:
    assert_answered(await call(app, "GET", path, sent_headers))
