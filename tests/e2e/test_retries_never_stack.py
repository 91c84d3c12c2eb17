"""openai-python's own retries never stack on stormguard's.

openai-python retries a 408, 409, 429 and 5xx, a timeout and a connection error, twice
by default. Over stormguard's transport each of its retries would be a new logical call
with stormguard's own retries: one call that met a 500 cost the server 4 requests where
stormguard alone sends 2. With openai left at its defaults, in both wirings
(``openai.OpenAI(http_client=stormguard.httpx_client(...))`` and ``stormguard.OpenAI``),
the server must see exactly the requests stormguard alone sends for the same failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

import stormguard
from stormguard.testing import FakeClock
from tests.e2e.hostile_server import (
    HEAD_SSE,
    Behaviour,
    HostileServer,
    RawRequest,
    answer,
    never_answer,
)

pytestmark = pytest.mark.e2e

PATH = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
ERROR = {"error": {"message": "no", "type": "server_error"}}


def closes_at_once() -> Behaviour:
    """Read the request, then close the connection without a word."""

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return behaviour


def stream_cut_before_its_first_event() -> Behaviour:
    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD_SSE + b": warming up\n\n")
        await writer.drain()
        writer.close()

    return behaviour


#: Each failure: the server's behaviour, whether the call streams, the client's timeout.
FAILURES: dict[str, tuple[Callable[[], Behaviour], bool, float]] = {
    "500": (lambda: answer(500, ERROR), False, 10.0),
    "429": (lambda: answer(429, ERROR, [("retry-after-ms", "50")]), False, 10.0),
    "503 shed": (
        lambda: answer(503, ERROR, [("retry-after-ms", "50"), ("x-load-shed", "queue_full")]),
        False,
        10.0,
    ),
    "connection closed": (closes_at_once, False, 10.0),
    "stream cut before its first event": (stream_cut_before_its_first_event, True, 10.0),
    # a server that never answers: the call's deadline ends it
    "timeout": (never_answer, False, 0.6),
}


def _call(client: Any, stream: bool) -> None:
    kwargs: dict[str, Any] = {"model": "m", "messages": HI}
    if stream:
        for _ in client.chat.completions.create(stream=True, **kwargs):
            pass
    else:
        client.chat.completions.create(**kwargs)


def _requests(wiring: str, behaviour: Behaviour, stream: bool, timeout: float) -> int:
    """The requests the server saw for one failing call through ``wiring``, openai
    (where it is there) at its default retries."""
    with HostileServer({PATH: behaviour}) as server:
        client: Any
        if wiring == "stormguard":
            client = stormguard.Client(base_url=server.base_url, timeout=timeout)
        elif wiring == "openai_client":
            client = stormguard.OpenAI(base_url=server.base_url, api_key="k", timeout=timeout)
        else:
            http = stormguard.httpx_client(base_url=server.base_url, timeout=timeout)
            client = openai.OpenAI(base_url=server.base_url, api_key="k", http_client=http)
            assert client.max_retries == 2  # openai's default, left as it is
        with client, pytest.raises((stormguard.StormguardError, openai.OpenAIError)) as raised:
            _call(client, stream)
        if wiring != "stormguard" and isinstance(raised.value, openai.APIConnectionError):
            # as every openai error, it has a request: LangChain builds its own from it
            openai.APIConnectionError(message=raised.value.message, request=raised.value.request)
        return len(server.requests_to(PATH))


@pytest.fixture(params=list(FAILURES), ids=list(FAILURES))
def failure(request: pytest.FixtureRequest) -> tuple[Callable[[], Behaviour], bool, float]:
    return FAILURES[request.param]


@pytest.mark.parametrize("wiring", ["transport", "openai_client"])
def test_the_server_sees_what_stormguard_alone_sends(
    wiring: str, failure: tuple[Callable[[], Behaviour], bool, float]
) -> None:
    make, stream, timeout = failure
    alone = _requests("stormguard", make(), stream, timeout)
    assert 1 <= alone <= 3
    assert _requests(wiring, make(), stream, timeout) == alone


def test_a_final_error_status_says_not_to_retry() -> None:
    with HostileServer({PATH: answer(500, ERROR, [("x-should-retry", "true")])}) as server:
        http = stormguard.httpx_client(base_url=server.base_url)
        with (
            openai.OpenAI(base_url=server.base_url, api_key="k", http_client=http) as client,
            pytest.raises(openai.InternalServerError) as raised,
        ):
            client.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    # stormguard decided; the server's own "true" is not passed on as an invitation
    assert raised.value.response.headers["x-should-retry"] == "false"


async def test_the_async_wirings_too() -> None:
    with HostileServer({PATH: answer(500, ERROR)}) as server:
        async with stormguard.AsyncClient(base_url=server.base_url) as alone:
            with pytest.raises(stormguard.InternalServerError):
                await alone.chat.completions.create(model="m", messages=HI)
        sent = len(server.requests)
        async with stormguard.AsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        assert len(server.requests) == 2 * sent
        http = stormguard.async_httpx_client(base_url=server.base_url)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=http) as c:
            with pytest.raises(openai.InternalServerError):
                await c.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        assert len(server.requests) == 3 * sent


# -- openai-python 1.x: it retries an OpenAIError raised under it -----------------------


def _openai_request(url: str, retry: int, body: bytes = b'{"model": "m"}') -> httpx.Request:
    return httpx.Request(
        "POST",
        url,
        content=body,
        headers={"x-stainless-retry-count": str(retry), "content-type": "application/json"},
    )


def test_openais_retry_of_a_failed_call_is_answered_without_a_call() -> None:
    """What openai-python 1.x does after a failure raised as its own error: the same
    request again, with ``x-stainless-retry-count: 1``. It gets the same failure, as its
    HTTP library's error (so its last retry maps a timeout to ``APITimeoutError``), and
    the server sees nothing more."""
    with HostileServer({PATH: closes_at_once()}) as server:
        http = stormguard.httpx_client(base_url=server.base_url, library="httpx")
        url = server.base_url + "/chat/completions"
        with pytest.raises(openai.APIConnectionError) as first:
            http.send(_openai_request(url, 0))
        sent = len(server.requests)
        started = time.monotonic()
        for retry in (1, 2):
            with pytest.raises(httpx.TransportError) as again:
                http.send(_openai_request(url, retry))
            assert str(again.value) == str(stormguard_httpx_error(first.value))
        assert len(server.requests) == sent and time.monotonic() - started < 0.5
        # another request (another body) is a call of its own
        with pytest.raises(openai.APIConnectionError):
            http.send(_openai_request(url, 1, b'{"model": "other"}'))
        assert len(server.requests) > sent
        http.close()


def stormguard_httpx_error(error: BaseException) -> BaseException:
    from stormguard._transport.answers import httpx_error_for

    assert isinstance(error, stormguard.StormguardError)
    return httpx_error_for(error, _openai_request("http://x/v1", 0))


def test_failures_are_remembered_for_a_while_and_a_bounded_number() -> None:
    from stormguard._transport.retries import MAX_REMEMBERED, REMEMBER_S, FailedCalls

    clock = FakeClock()
    failed = FailedCalls(clock)
    url = "http://127.0.0.1:9/v1/chat/completions"
    failed.remember(_openai_request(url, 0), httpx.ReadTimeout("too slow"))
    assert failed.answer(_openai_request(url, 0)) is None  # not a retry
    answer_ = failed.answer(_openai_request(url, 1))
    assert isinstance(answer_, httpx.ReadTimeout) and str(answer_) == "too slow"
    clock.advance(REMEMBER_S + 1)
    assert failed.answer(_openai_request(url, 1)) is None
    for index in range(MAX_REMEMBERED + 10):
        failed.remember(_openai_request(url, 0, str(index).encode()), httpx.ReadError("x"))
    assert len(failed._failures) == MAX_REMEMBERED
    assert failed.answer(_openai_request(url, 1, b"0")) is None  # the oldest went first
    assert failed.answer(_openai_request(url, 1, str(MAX_REMEMBERED + 9).encode())) is not None


def test_a_retry_count_of_other_digits_is_no_retry() -> None:
    """``x-stainless-retry-count: ¹`` (latin-1 0xb9: a digit to ``str.isdigit``, no
    number to ``int()``) is no retry of openai's, and no ValueError."""
    from stormguard._transport.retries import FailedCalls

    request = httpx.Request(
        "POST",
        "http://127.0.0.1:9/v1/chat/completions",
        headers=[(b"x-stainless-retry-count", b"\xb9")],
    )
    assert FailedCalls(FakeClock()).answer(request) is None
