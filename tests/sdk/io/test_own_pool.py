"""The pool a client builds for itself (``OwnClient``, ``OwnAsyncClient``).

A streamed send with nothing for httpx to do goes straight to the transport; what
comes back must still be what httpx's ``send`` gives (its request, its elapsed
time, an error naming its request, the cookies it sets). Everything else (a jar
with cookies, credentials in the URL, mounts, auth, redirects, a body read at
once, a closed client) must take httpx's own way. ``attempt_request`` must build
what ``build_request`` builds. Each test runs on both clients, on mock transports.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import respx

import stormguard
from stormguard._io.own_pool import OwnAsyncClient, OwnClient, attempt_request
from tests.sdk.helpers import BASE as API_BASE
from tests.sdk.helpers import MESSAGES, chat_json

URL = "http://llm.test/v1/chat/completions"
TIMEOUT = {"extensions": {"timeout": httpx.Timeout(5.0).as_dict()}}


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body in pieces that is read only when asked, as a server's is."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def streamed(status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers, stream=Body(b"hel", b"lo"))


class Pool:
    """Builds own pools on mock transports and drives them the same way in both modes.

    ``sent`` holds the requests that reached the pool's transport, ``mounted``
    those that reached a mounted one, ``through_httpx`` those that httpx's own
    ``send`` handed on (its ``_send_single_request``, watched on both clients).
    """

    def __init__(self, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mode = mode
        self.sent: list[httpx.Request] = []
        self.mounted: list[httpx.Request] = []
        self.through_httpx: list[httpx.Request] = []
        self.respond: Callable[[httpx.Request], httpx.Response] = lambda request: streamed()
        self._clients: list[Any] = []
        for cls in (httpx.Client, httpx.AsyncClient):
            monkeypatch.setattr(cls, "_send_single_request", self._watch(cls._send_single_request))

    def _watch(self, original: Callable[[Any, httpx.Request], Any]) -> Callable[..., Any]:
        def watched(client: Any, request: httpx.Request) -> Any:
            self.through_httpx.append(request)
            return original(client, request)  # the async one's coroutine, awaited by httpx

        return watched

    def transport(self, into: list[httpx.Request]) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            into.append(request)
            return self.respond(request)

        return httpx.MockTransport(handle)

    def client(self, mounts: dict[str, Any] | None = None) -> Any:
        cls = OwnClient if self.mode == "sync" else OwnAsyncClient
        client = cls(transport=self.transport(self.sent), mounts=mounts or {})
        self._clients.append(client)
        return client

    async def run(self, value: Any) -> Any:
        return await value if self.mode == "async" else value

    async def send(self, client: Any, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("stream", True)
        response: httpx.Response = await self.run(client.send(request, **kwargs))
        return response

    async def get(self, client: Any, url: str = URL) -> httpx.Response:
        return await self.send(client, client.build_request("GET", url, **TIMEOUT))

    async def read(self, response: httpx.Response) -> bytes:
        body: bytes = await self.run(response.read() if self.mode == "sync" else response.aread())
        return body

    async def close(self, response: httpx.Response) -> None:
        if self.mode == "sync":
            response.close()
        else:
            await response.aclose()

    async def close_client(self, client: Any) -> None:
        await self.run(client.close() if self.mode == "sync" else client.aclose())

    async def close_all(self) -> None:
        for client in self._clients:
            await self.close_client(client)


@pytest.fixture(params=["sync", "async"])
async def pool(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Pool]:
    helper = Pool(request.param, monkeypatch)
    yield helper
    await helper.close_all()


async def test_a_streamed_send_goes_straight_to_the_transport(pool: Pool) -> None:
    client = pool.client()
    request = client.build_request("GET", URL, **TIMEOUT)
    response = await pool.send(client, request)
    assert pool.sent == [request] and pool.through_httpx == []
    assert response.request is request
    assert not response.is_stream_consumed  # the body is still the caller's to read
    assert await pool.read(response) == b"hello"


@pytest.mark.parametrize("finish", ["close", "read"])
async def test_elapsed_is_set_once_the_body_is_closed_or_read(pool: Pool, finish: str) -> None:
    client = pool.client()
    body = Body(b"hel", b"lo")
    pool.respond = lambda request: httpx.Response(200, stream=body)
    response = await pool.get(client)
    with pytest.raises(RuntimeError, match="elapsed"):
        response.elapsed  # noqa: B018
    await (pool.close(response) if finish == "close" else pool.read(response))
    assert isinstance(response.elapsed, datetime.timedelta)
    assert response.elapsed >= datetime.timedelta(0)
    assert response.is_closed and pool.through_httpx == []
    assert body.closed  # the transport's body too


@pytest.mark.parametrize("build", ["attempt_request", "build_request"])
async def test_a_cookie_set_is_kept_and_sent_by_httpx_with_the_next_request(
    pool: Pool, build: str
) -> None:
    client = pool.client()
    pool.respond = lambda request: streamed(headers={"set-cookie": "session=abc; Path=/"})
    await pool.close(await pool.get(client))
    assert pool.through_httpx == []  # the jar was empty: straight to the transport
    assert client.cookies.get("session") == "abc"
    if build == "attempt_request":
        request = attempt_request(
            client,
            "POST",
            URL,
            content=b"{}",
            base={},
            headers={},
            extensions=TIMEOUT["extensions"],
        )
    else:
        request = client.build_request("POST", URL, content=b"{}", **TIMEOUT)
    await pool.close(await pool.send(client, request))
    assert pool.sent[-1].headers["cookie"] == "session=abc"
    assert pool.through_httpx == [request]


async def test_credentials_in_the_url_are_sent_as_basic_auth(pool: Pool) -> None:
    client = pool.client()
    response = await pool.get(client, "http://user:pass@llm.test/v1/models")
    await pool.close(response)
    expected = "Basic " + base64.b64encode(b"user:pass").decode()
    assert pool.sent[-1].headers["authorization"] == expected
    assert len(pool.through_httpx) == 1


@pytest.mark.parametrize("pattern", ["http://", "all://", "all://llm.test"])
async def test_a_mounted_transport_gets_the_requests_its_pattern_matches(
    pool: Pool, pattern: str
) -> None:
    client = pool.client(mounts={pattern: pool.transport(pool.mounted)})
    response = await pool.get(client)
    assert await pool.read(response) == b"hello"
    assert pool.mounted == pool.through_httpx == [response.request] and pool.sent == []


async def test_mounts_only_to_the_default_transport_keep_the_short_way(pool: Pool) -> None:
    client = pool.client(mounts={"all://localhost": None})  # what NO_PROXY=localhost mounts
    response = await pool.get(client)
    assert await pool.read(response) == b"hello"
    assert pool.sent == [response.request] and pool.through_httpx == []


async def test_a_body_read_at_once_takes_httpxs_way(pool: Pool) -> None:
    client = pool.client()
    request = client.build_request("GET", URL, **TIMEOUT)
    response = await pool.send(client, request, stream=False)
    assert response.content == b"hello" and response.is_closed
    assert response.elapsed >= datetime.timedelta(0)
    assert pool.through_httpx == [request]


async def test_auth_asked_for_by_the_send_is_applied(pool: Pool) -> None:
    client = pool.client()
    request = client.build_request("GET", URL, **TIMEOUT)
    await pool.close(await pool.send(client, request, auth=("user", "pass")))
    expected = "Basic " + base64.b64encode(b"user:pass").decode()
    assert pool.sent[-1].headers["authorization"] == expected
    assert pool.through_httpx == [request]


def redirecting(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/old":
        return httpx.Response(302, headers={"location": "/new"}, stream=Body())
    return streamed()


async def test_a_redirect_asked_to_be_followed_is_followed(pool: Pool) -> None:
    client = pool.client()
    pool.respond = redirecting
    response = await pool.send(
        client, client.build_request("GET", "http://llm.test/old", **TIMEOUT), follow_redirects=True
    )
    assert response.status_code == 200 and await pool.read(response) == b"hello"
    assert [r.url.path for r in pool.sent] == ["/old", "/new"]
    assert [r.status_code for r in response.history] == [302]
    assert pool.through_httpx == pool.sent


async def test_a_redirect_asked_not_to_be_followed_names_the_next_request(pool: Pool) -> None:
    client = pool.client()
    pool.respond = redirecting
    response = await pool.send(
        client,
        client.build_request("GET", "http://llm.test/old", **TIMEOUT),
        follow_redirects=False,
    )
    await pool.close(response)
    assert response.status_code == 302 and len(pool.through_httpx) == 1
    assert response.next_request is not None and response.next_request.url.path == "/new"


async def test_a_transport_error_names_the_request_sent(pool: Pool) -> None:
    client = pool.client()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("x")

    pool.respond = refuse
    request = client.build_request("GET", URL, **TIMEOUT)
    with pytest.raises(httpx.ConnectError) as caught:
        await pool.send(client, request)
    assert caught.value.request is request
    assert pool.through_httpx == []


async def test_sending_on_a_closed_pool_fails_as_httpxs_does(pool: Pool) -> None:
    client = pool.client()
    request = client.build_request("GET", URL, **TIMEOUT)
    await pool.close_client(client)
    with pytest.raises(RuntimeError, match="client has been closed"):
        await pool.send(client, request)
    assert pool.sent == []


# attempt_request: the request build_request would build, from caches of its own.

BASE = {"accept": "application/json", "user-agent": "sg/1", "authorization": "Bearer a"}
EXTENSIONS = {"timeout": httpx.Timeout(5.0).as_dict(), "sni_hostname": "llm.test"}


def assert_same_request(built: httpx.Request, expected: httpx.Request) -> None:
    assert built.method == expected.method
    assert built.url == expected.url
    assert built.headers.raw == expected.headers.raw  # names as given, values, order
    assert built.headers.multi_items() == expected.headers.multi_items()
    assert built.content == expected.content
    assert built.extensions == expected.extensions


def both_ways(
    client: Any,
    url: str = URL,
    *,
    method: str = "POST",
    base: dict[str, str] = BASE,
    headers: dict[str, str] | None = None,
    content: bytes | None = b'{"model": "m"}',
) -> tuple[httpx.Request, httpx.Request]:
    headers = headers or {}
    built = attempt_request(
        client,
        method,
        url,
        content=content,
        base=base,
        headers=headers,
        extensions=dict(EXTENSIONS),
    )
    expected = client.build_request(
        method, url, content=content, headers={**base, **headers}, extensions=dict(EXTENSIONS)
    )
    return built, expected


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-stormguard-attempt": "2", "x-stormguard-deadline-ms": "1500"},
        {"accept": "text/event-stream"},  # a base header, as the call gives it
        {"host": "svc.test"},  # a discovered address
    ],
)
@pytest.mark.parametrize("content", [b'{"model": "m"}', b"", None])
@pytest.mark.parametrize("method", ["POST", "GET", "PUT", "DELETE"])
async def test_attempt_request_builds_what_build_request_builds(
    pool: Pool, headers: dict[str, str], content: bytes | None, method: str
) -> None:
    client = pool.client()
    for _ in range(2):  # the second from the caches
        assert_same_request(*both_ways(client, method=method, headers=headers, content=content))


@pytest.mark.parametrize(
    "headers",
    [{"Content-Length": "14"}, {"transfer-encoding": "chunked"}, {"HOST": "svc.test"}],
)
async def test_attempt_request_with_a_header_httpx_would_add_builds_what_build_request_builds(
    pool: Pool, headers: dict[str, str]
) -> None:
    client = pool.client()
    assert_same_request(*both_ways(client, headers=headers))
    assert_same_request(*both_ways(client, headers=headers, content=None))


async def test_attempt_request_to_a_url_with_a_port_and_a_path_builds_what_build_request_builds(
    pool: Pool,
) -> None:
    client = pool.client()
    for url in ("http://127.0.0.1:8000/v1/chat/completions", "https://[::1]:8443/v1/models?a=1"):
        assert_same_request(*both_ways(client, url))


async def test_a_request_from_the_cache_shares_no_headers_with_the_next(pool: Pool) -> None:
    client = pool.client()
    first, _ = both_ways(client, headers={"x-stormguard-attempt": "1", "accept": "text/plain"})
    first.headers["x-only-first"] = "1"
    built, expected = both_ways(client)
    assert_same_request(built, expected)
    assert "x-stormguard-attempt" not in built.headers and built.headers["accept"] == BASE["accept"]


async def test_an_attempt_header_overrides_a_base_one_in_any_case(pool: Pool) -> None:
    client = pool.client()
    request = attempt_request(
        client,
        "GET",
        URL,
        content=None,
        base={"User-Agent": "a", "accept": "application/json"},
        headers={"user-agent": "b", "Accept": "text/event-stream"},
        extensions=dict(EXTENSIONS),
    )
    assert request.headers.get_list("user-agent") == ["b"]
    assert request.headers.get_list("accept") == ["text/event-stream"]


async def test_attempt_request_with_cookies_in_the_jar_builds_what_build_request_builds(
    pool: Pool,
) -> None:
    client = pool.client()
    both_ways(client)  # caches filled before the jar has a cookie
    client.cookies.set("session", "abc", domain="llm.test")
    built, expected = both_ways(client, headers={"x-stormguard-attempt": "1"})
    assert_same_request(built, expected)
    assert built.headers["cookie"] == "session=abc"


async def test_each_base_mapping_gives_its_own_headers(pool: Pool) -> None:
    client = pool.client()
    one, other = {"x-tenant": "one"}, {"x-tenant": "other", "x-extra": "1"}
    for base in (one, other, one, other):
        assert_same_request(*both_ways(client, base=base))
    for n in range(300):  # more bases than the cache holds: it starts over
        built, expected = both_ways(client, base={"x-tenant": str(n)})
        assert built.headers["x-tenant"] == str(n)
        assert_same_request(built, expected)
    assert len(client._merged) <= 256


async def test_more_urls_than_the_cache_holds_still_give_their_own(pool: Pool) -> None:
    client = pool.client()
    urls = [f"http://llm.test/v1/{n}?q={n}" for n in range(300)]
    for url in [*urls, urls[0], urls[-1]]:
        built, expected = both_ways(client, url)
        assert built.url == httpx.URL(url)
        assert_same_request(built, expected)
    assert len(client._urls) <= 256


@pytest.mark.parametrize("own_pool", [True, False], ids=["own pool", "given http_client"])
def test_a_calls_header_replaces_the_clients_whatever_its_case(own_pool: bool) -> None:
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=chat_json())

    options: dict[str, Any] = {"base_url": API_BASE, "api_key": "sk-client-key", "model": "m"}
    if own_pool:
        with respx.mock(base_url=API_BASE) as router:
            router.post("/chat/completions").mock(side_effect=handle)
            with stormguard.Client(**options) as client:
                client.chat.completions.create(
                    messages=MESSAGES, extra_headers={"Authorization": "Bearer sk-call-key"}
                )
    else:
        http = httpx.Client(transport=httpx.MockTransport(handle))
        with stormguard.Client(http_client=http, **options) as client:
            client.chat.completions.create(
                messages=MESSAGES, extra_headers={"Authorization": "Bearer sk-call-key"}
            )
    assert sent[-1].headers.get_list("authorization") == ["Bearer sk-call-key"]
