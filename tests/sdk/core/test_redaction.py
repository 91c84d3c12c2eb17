"""Credentials never leave the client in shown text: the scrubber on its own, then
the texts of errors and spans built from a server's echo, through respx.

The hostile-server end-to-end version (every echo a raw server can make, sync and
async, streamed and not, under openai-python too) is in tests/e2e/test_hostile_server.py.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest
import respx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard import ServerLoad
from stormguard._core.redact import MIN_SECRET_LENGTH, REDACTED, Redactor, display_url
from stormguard.telemetry import Telemetry
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, sse

KEY = "sk-proj-Zq3vB8kLmN2pR7tW9xYc4dF6gH1jK5sA0eUiOoPl"
NO_RETRY = stormguard.RetryPolicy(max_attempts=1)


def leaks(text: str, key: str = KEY) -> bool:
    """Whether ``text`` shows ``key``, in any case, or an 8-character start or end of it."""
    lowered = text.lower()
    return any(part.lower() in lowered for part in (key, key[:8], key[-8:]))


# -- the scrubber --------------------------------------------------------------------


def test_every_occurrence_is_replaced_and_other_text_kept() -> None:
    r = Redactor([KEY])
    assert r.scrub(f"a {KEY} b {KEY}{KEY} c") == f"a {REDACTED} b {REDACTED}{REDACTED} c"
    assert r.scrub("nothing here") == "nothing here"


@pytest.mark.parametrize(
    "form",
    [
        KEY.lower(),
        KEY.upper(),
        urllib.parse.quote("sk/+=:" + KEY, safe="").removeprefix("sk%2F%2B%3D%3A"),
    ],
    ids=["lower-cased", "upper-cased", "percent-encoded"],
)
def test_the_key_is_found_transformed(form: str) -> None:
    assert Redactor([KEY]).scrub(f"<{form}>") == f"<{REDACTED}>"


def test_a_key_with_url_and_json_special_characters_is_found_encoded() -> None:
    key = 'key/with+plus="quote"\\slash'
    r = Redactor([key])
    for shown in (urllib.parse.quote(key, safe=""), json.dumps(key)[1:-1], key):
        assert r.scrub(f"x {shown} y") == f"x {REDACTED} y", shown


@pytest.mark.parametrize("user", ["", "u", "us", "use", "apikey"])
def test_a_basic_header_echoed_back_is_scrubbed_whatever_the_user(user: str) -> None:
    """base64 puts the password at one of three byte alignments: each is covered."""
    echoed = base64.b64encode(f"{user}:{KEY}".encode()).decode()
    shown = Redactor([KEY]).scrub(f"you sent Basic {echoed}")
    assert echoed not in shown and REDACTED in shown
    # What is left decodes to at most two characters of the key on either side.
    head, _, tail = shown.removeprefix("you sent Basic ").partition(REDACTED)
    assert len(base64.b64decode(head[: len(head) // 4 * 4])) <= len(user) + 1 + 2
    assert len(tail.rstrip("=")) <= 3


@pytest.mark.parametrize("at", range(480, 501))
def test_a_key_straddling_the_cut_is_scrubbed_whole(at: int) -> None:
    text = "x" * at + KEY + "y" * 600
    quoted = Redactor([KEY]).quote(text, 500)
    assert len(quoted) == 500 and not leaks(quoted)
    assert quoted.startswith("x" * at)


def test_a_key_after_multibyte_characters_is_scrubbed_before_the_cut() -> None:
    """The cut is in characters, the body in bytes: 100 two-byte characters put the
    key's first byte 100 bytes later than its first character."""
    body = ("é" * 100 + "x" * 340 + KEY + "y" * 100).encode()
    quoted = Redactor([KEY]).quote_bytes(body, 500)
    assert not leaks(quoted) and REDACTED[:5] in quoted


def test_quote_bytes_of_undecodable_bytes() -> None:
    quoted = Redactor([KEY]).quote_bytes(b"\xff\xfe" + KEY.encode() + b"\xc3", 60)
    assert quoted == "\ufffd\ufffd" + REDACTED + "\ufffd"


@pytest.mark.parametrize("key", ["", "x", "EMPTY", "a" * (MIN_SECRET_LENGTH - 1)])
def test_keys_shorter_than_the_minimum_are_left_in_place(key: str) -> None:
    """A one-letter key must not turn every message into [redacted]; placeholder keys
    ("EMPTY", vLLM's) protect nothing."""
    r = Redactor([key])
    text = f"Bad request: x EMPTY {'a' * 10}"
    assert r.scrub(text) == text and r.quote(text, 12) == text[:12] and not r


def test_a_key_of_the_minimum_length_is_scrubbed() -> None:
    key = "k" * MIN_SECRET_LENGTH
    assert Redactor([key]).scrub(f"{key}!") == f"{REDACTED}!"


def test_the_longest_secret_wins_when_one_contains_another() -> None:
    r = Redactor([KEY, KEY[:20]])
    assert r.scrub(f"[{KEY}] [{KEY[:20]}]") == f"[{REDACTED}] [{REDACTED}]"


def test_the_repr_counts_secrets_without_showing_them() -> None:
    r = Redactor([KEY, "another-secret"])
    assert repr(r) == "Redactor(2 secrets)" and not leaks(repr(r))


# -- where secrets come from ---------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer   {KEY}  "},
        {"api-key": KEY},  # Azure OpenAI
        {"x-api-key": KEY},
        {"ocp-apim-subscription-key": KEY},
        {"x-auth-token": KEY},
        {"authorization": "Basic " + base64.b64encode(f"user:{KEY}".encode()).decode()},
        {"cookie": f"session={KEY}; theme=dark"},
    ],
    ids=lambda h: next(iter(h)),
)
def test_credential_headers_are_secrets(headers: dict[str, str]) -> None:
    assert Redactor.for_client(headers=headers).scrub(f"echo {KEY}") == f"echo {REDACTED}"


def test_other_headers_are_not_secrets() -> None:
    r = Redactor.for_client(headers={"user-agent": "stormguard/1.0.0", "x-priority": "sheddable"})
    assert not r and r.scrub("stormguard/1.0.0 sheddable") == "stormguard/1.0.0 sheddable"


def test_url_userinfo_and_credential_query_values_are_secrets() -> None:
    password = "p@ss:word/" + KEY[:12]
    url = (
        f"http://{urllib.parse.quote(KEY, safe='')}:{urllib.parse.quote(password, safe='')}"
        f"@llm.test/v1?api-key=query-secret-1234&page=12345678"
    )
    r = Redactor.for_client(urls=[url])
    for secret in (KEY, password, urllib.parse.quote(password, safe=""), "query-secret-1234"):
        assert r.scrub(f"<{secret}>") == f"<{REDACTED}>", secret
    assert r.scrub("page=12345678") == "page=12345678"


def test_a_call_adds_its_own_credentials_and_shares_redactors() -> None:
    client = Redactor.for_client(headers={"authorization": f"Bearer {KEY}"})
    assert client.including(headers={"authorization": f"Bearer {KEY}"}) is client
    assert client.including(headers={"x-trace": "abcdefghijkl"}) is client
    other = "sk-other-key-0123456789"
    call = client.including(headers={"api-key": other})
    assert call.scrub(f"{KEY} {other}") == f"{REDACTED} {REDACTED}"
    assert client.including(headers={"api-key": other}) is call  # cached, not rebuilt


def test_display_url_hides_userinfo_signatures_and_credential_parameters() -> None:
    shown = display_url(f"http://user:{KEY}@llm.test:8000/v1/x?sig=abc&model=m&api-key={KEY}")
    assert shown == (
        "http://REDACTED:REDACTED@llm.test:8000/v1/x?sig=REDACTED&model=m&api-key=REDACTED"
    )
    assert display_url("http://llm.test/v1") == "http://llm.test/v1"
    assert display_url("http://host:port/") == "<invalid URL>"


# -- structured values ---------------------------------------------------------------


def test_scrub_json_replaces_keys_and_values_and_keeps_a_clean_value_as_is() -> None:
    r = Redactor([KEY])
    body = {"error": {"message": f"bad key {KEY}", KEY: [1, KEY, None, True]}}
    assert r.scrub_json(body) == {
        "error": {"message": f"bad key {REDACTED}", REDACTED: [1, REDACTED, None, True]}
    }
    clean = {"error": {"message": "fine"}}
    assert r.scrub_json(clean) is clean


def test_scrub_json_of_a_body_nested_too_deep_to_check_shows_nothing() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert Redactor([KEY]).scrub_json(deep) == REDACTED


def test_scrub_load_scrubs_the_free_text_of_the_load_headers() -> None:
    load = ServerLoad.from_headers({"x-load-shed": KEY, "x-queue-depth": "3"})
    assert load.load_shed == KEY.lower()  # parsed lower-cased, still the key
    scrubbed = Redactor([KEY]).scrub_load(load)
    assert scrubbed.load_shed == REDACTED and scrubbed.queue_depth == 3
    plain = ServerLoad(load_shed="queue_full")
    assert Redactor([KEY]).scrub_load(plain) is plain


def test_scrub_error_scrubs_every_string_it_carries() -> None:
    error = stormguard.InternalServerError(
        f"Error code: 500 - {KEY}",
        status_code=500,
        body=f"text {KEY}",
        raw_body=KEY.encode(),
        request_id=f"req-{KEY}",
        server_load=ServerLoad(load_shed=KEY.lower()),
    )
    Redactor([KEY]).scrub_error(error)
    for text in (str(error), repr(error), error.message, error.body, error.request_id):
        assert isinstance(text, str) and not leaks(text), text
    assert error.server_load.load_shed == REDACTED
    assert error.raw_body == KEY.encode()  # the server's bytes, as they came


# -- through the client (respx) ------------------------------------------------------


def error_texts(error: BaseException) -> list[str]:
    texts = [str(error), repr(error), *map(str, error.args)]
    texts += [v for v in vars(error).values() if isinstance(v, str)]
    load = getattr(error, "server_load", None)
    if load is not None and load.load_shed is not None:
        texts.append(load.load_shed)
    body = getattr(error, "body", None)
    if body is not None:
        texts.append(json.dumps(body))
    return texts


def assert_scrubbed(error: BaseException, key: str = KEY) -> None:
    for text in error_texts(error):
        assert not leaks(text, key), text[-200:]


@pytest.mark.parametrize(
    "options",
    [
        {"api_key": KEY},
        {"api_key": None, "default_headers": {"api-key": KEY}},
        {"api_key": None, "default_headers": {"Authorization": f"Bearer {KEY}"}},
        {"api_key": None, "base_url": f"http://user:{KEY}@llm.test/v1"},
    ],
    ids=["api_key", "azure api-key header", "bearer default header", "url password"],
)
async def test_every_way_of_giving_the_key_is_scrubbed(
    api: Api, mock: respx.MockRouter, options: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("STORMGUARD_API_KEY", raising=False)

    def echo(request: httpx.Request) -> httpx.Response:
        sent = request.headers.get("authorization") or request.headers["api-key"]
        return httpx.Response(
            401,
            json={"error": {"message": f"Bad credentials: {sent}"}},
            headers={"x-request-id": sent},
        )

    mock.post("/chat/completions").mock(side_effect=echo)
    client = api.client(retry_policy=NO_RETRY, **options)
    with pytest.raises(stormguard.AuthenticationError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert_scrubbed(info.value)
    assert REDACTED in str(info.value) and not leaks(repr(client))


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text=f"plain {KEY}", headers={"content-type": "application/json"}),
        httpx.Response(200, json=[KEY]),
        httpx.Response(200, json=chat_json(), headers={"content-type": f"text/plain; {KEY}"}),
        httpx.Response(500, text="x" * 470 + KEY + "y" * 600, headers={"x-request-id": KEY}),
        httpx.Response(503, json={"detail": [{"msg": KEY}]}, headers={"x-load-shed": KEY}),
    ],
    ids=["text body", "json list body", "content-type", "text error", "detail and shed"],
)
async def test_a_key_echoed_in_a_response_is_scrubbed(
    api: Api, mock: respx.MockRouter, response: httpx.Response
) -> None:
    mock.post("/chat/completions").mock(return_value=response)
    client = api.client(api_key=KEY, retry_policy=NO_RETRY, concurrency=None)
    with pytest.raises(stormguard.APIError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert_scrubbed(info.value)


@pytest.mark.parametrize(
    "body",
    [
        sse(f"not json {KEY}"),
        sse(json.dumps({"error": {"message": f"shed {KEY}", "code": 503}})),
        sse(chunk("hi"), json.dumps({"error": {"message": "x" * 495 + KEY}}), done=False),
    ],
    ids=["non-JSON data", "error event", "error after a chunk"],
)
async def test_a_key_echoed_in_a_stream_is_scrubbed(
    api: Api, mock: respx.MockRouter, body: bytes
) -> None:
    mock.post("/chat/completions").respond(
        200, content=body, headers={"content-type": "text/event-stream", "x-request-id": KEY}
    )
    client = api.client(api_key=KEY, retry_policy=NO_RETRY, concurrency=None)
    with pytest.raises(stormguard.APIError) as info:
        stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
        await api.collect(stream)
    assert_scrubbed(info.value)


async def test_a_library_error_quoting_a_header_line_is_scrubbed(
    api: Api, mock: respx.MockRouter
) -> None:
    """h11 quotes the offending line of a malformed response head."""
    line = f"x-echo: {KEY}\x01".encode()
    mock.post("/chat/completions").mock(
        side_effect=httpx.RemoteProtocolError(f"illegal header line: {line!r}")
    )
    client = api.client(api_key=KEY, retry_policy=NO_RETRY)
    with pytest.raises(stormguard.APIConnectionError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert_scrubbed(info.value)
    assert "illegal header line" in str(info.value)


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, Telemetry]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, Telemetry(tracer_provider=provider, capture_content=True)
    provider.shutdown()


def span_texts(spans: tuple[ReadableSpan, ...]) -> list[str]:
    texts: list[str] = []
    for span in spans:
        texts += [span.name, span.status.description or ""]
        texts += [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            texts += [event.name, *(str(v) for v in (event.attributes or {}).values())]
    return texts


async def test_spans_carry_no_echoed_key(
    api: Api,
    mock: respx.MockRouter,
    exporter: tuple[InMemorySpanExporter, Telemetry],
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory, telemetry = exporter
    answer = chat_json(content=f"your key is {KEY}", id=f"id-{KEY}", model=KEY)
    route = mock.post("/chat/completions")
    route.side_effect = [
        httpx.Response(503, text="y" * 290 + KEY, headers={"x-load-shed": KEY}),
        httpx.Response(200, json=answer),
    ]
    client = api.client(
        api_key=KEY,
        base_url=f"http://user:{KEY}@llm.test/v1",
        telemetry=telemetry,
        concurrency=None,
        retry_policy=stormguard.RetryPolicy(max_attempts=2),
    )
    with caplog.at_level(logging.DEBUG, logger="stormguard"):
        await api.run(client.chat.completions.create(messages=MESSAGES))
        route.side_effect = [httpx.Response(500, text="z" * 270 + KEY)] * 2
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    spans = memory.get_finished_spans()
    statuses = [s.status.description or "" for s in spans]
    assert any(REDACTED in d for d in statuses), statuses  # the key was in the cut's reach
    attrs = [dict(s.attributes or {}) for s in spans]
    assert {"stormguard.server.load_shed": REDACTED}.items() <= attrs[0].items()
    assert any(a.get("gen_ai.response.model") == REDACTED for a in attrs)
    assert any(a.get("url.full", "").startswith("http://REDACTED:REDACTED@") for a in attrs)
    for text in span_texts(spans) + [r.getMessage() for r in caplog.records]:
        assert not leaks(text), text
