"""Slow and hostile clients against the real server: what they can hold, and for how long.

Each bound is asserted on what the server did to the connection (closed it:
``recv`` gave ``b""`` or a reset; answered it: the status it sent), with short
limits set by flags so that every test takes seconds. Times are measured from
just before the client connects, which precedes the server's accept: a close
can come no sooner than the limit, and the slack above it is generous for a
busy machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.hostile_client import (
    PARTIAL_HEADERS,
    Held,
    hold,
    is_closed_now,
    many_headers_head,
    open_held,
    open_in_flight,
    partial_body_request,
)
from tests.e2e.server_process import RunningServer, run_server, spec

pytestmark = pytest.mark.e2e

Start = Callable[..., RunningServer]

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
# What a busy 2-core machine may add to a deadline before the close is seen.
SLACK_S = 5.0
LONG_S = "60"  # a timeout no test waits for


def chat_body(pad_to: int = 0) -> bytes:
    """A valid chat request, padded with trailing whitespace to ``pad_to`` bytes."""
    body = json.dumps(
        {
            "model": "stormguard-sim",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
    ).encode()
    return body + b" " * max(0, pad_to - len(body))


def chat(server: RunningServer, body: bytes | None = None) -> httpx.Response:
    """One normal request on a fresh connection."""
    return httpx.post(
        server.url("/v1/chat/completions"),
        content=chat_body() if body is None else body,
        headers={"content-type": "application/json"},
        timeout=30,
    )


@pytest.fixture(scope="module")
def timeouts_server() -> Iterator[RunningServer]:
    with run_server(
        "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S),
        "--max-body-bytes", "100000", "--max-buffered-body-bytes", "100000",
    ) as server:  # fmt: skip
        yield server


@pytest.fixture
def held() -> Iterator[list[Held]]:
    """Connections a test opens; closed after it, before its server stops."""
    conns: list[Held] = []
    yield conns
    for conn in conns:
        conn.close()


def closes(server: RunningServer, reason: str) -> float:
    """Connections the server says it closed for ``reason`` so far."""
    return server.metric(f'stormguard_http_connections_closed_total{{reason="{reason}"}}')


def settled(server: RunningServer, name: str, value: float) -> bool:
    """Whether the gauge ``name`` reaches ``value`` within the slack (the server sees
    a closed connection on a later turn of its loop, not at once)."""
    deadline = time.monotonic() + SLACK_S
    while server.metric(name) != value:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def assert_closed_within(conns: list[Held], limit: float) -> None:
    times = [conn.closed_after for conn in conns]
    assert all(t is not None for t in times), f"still open after {limit + SLACK_S} s: {times}"
    assert all(limit <= t <= limit + SLACK_S for t in times if t is not None), times


def test_slowloris_headers_are_closed_at_the_header_timeout(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    before = closes(timeouts_server, "header_timeout")
    held += [open_held(timeouts_server.port, PARTIAL_HEADERS) for _ in range(20)]
    # A byte every 0.1 s each: arriving bytes do not extend the deadline.
    hold(held, trickle=b"abcdefgh", interval=0.1, timeout=HEADER_TIMEOUT_S + SLACK_S)
    assert_closed_within(held, HEADER_TIMEOUT_S)
    assert all(conn.sent_after_open >= 2 for conn in held)
    assert all(conn.received == b"" for conn in held)  # closed, not answered
    assert closes(timeouts_server, "header_timeout") - before == 20
    assert chat(timeouts_server).status_code == 200


def test_connections_that_never_send_are_closed(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    held += [open_held(timeouts_server.port) for _ in range(10)]
    hold(held, timeout=HEADER_TIMEOUT_S + SLACK_S)
    assert_closed_within(held, HEADER_TIMEOUT_S)


def test_the_header_deadline_restarts_after_each_response_on_keep_alive(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    body = chat_body()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\n\r\n" + body
    )  # fmt: skip
    conn = open_held(timeouts_server.port, request)
    held.append(conn)
    while b"\r\n\r\n" not in conn.received and conn.closed is None:
        hold([conn], timeout=0.1)
    assert conn.status() == 200
    answered = conn.received.find(b"\r\n\r\n")
    assert answered > 0
    # Then a second request's headers, a byte at a time: closed like a new slowloris.
    conn.opened = time.monotonic()
    hold([conn], trickle=PARTIAL_HEADERS, interval=0.1, timeout=HEADER_TIMEOUT_S + SLACK_S)
    assert conn.closed_after is not None
    assert conn.closed_after <= HEADER_TIMEOUT_S + SLACK_S


def test_a_client_slow_within_the_deadline_is_served(stormguard_server_factory: Start) -> None:
    server = stormguard_server_factory("--header-timeout-s", "10")
    body = chat_body()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\n\r\n"
    )  # fmt: skip
    conn = open_held(server.port)
    try:
        hold([conn], trickle=head, interval=0.005, timeout=len(head) * 0.005)
        assert conn.closed is None
        conn.sock.setblocking(True)
        conn.sock.sendall(head[conn.sent_after_open :] + body)
        conn.sock.setblocking(False)
        hold([conn], timeout=30)
        assert conn.status() == 200, bytes(conn.received)
    finally:
        conn.close()


def test_a_partial_body_gets_408_and_its_connection_closed(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    before = closes(timeouts_server, "body_timeout")
    held += [open_held(timeouts_server.port, partial_body_request(10_000, 100)) for _ in range(5)]
    hold(held, timeout=BODY_TIMEOUT_S + SLACK_S)
    assert_closed_within(held, BODY_TIMEOUT_S)
    assert closes(timeouts_server, "body_timeout") - before == 5
    for conn in held:
        assert conn.status() == 408, bytes(conn.received)
        error = json.loads(conn.body())["error"]
        assert error["code"] == "body_timeout"
        assert error["type"] == "timeout"
        assert "within 1 s" in error["message"]
    assert chat(timeouts_server).status_code == 200


def test_a_client_far_ahead_of_its_request_is_closed_before_the_answer(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    body = json.dumps(
        {"model": "stormguard-sim", "prompt": "hi", "max_tokens": 500, "ignore_eos": True}
    ).encode()  # 500 engine steps: answered a second or more later
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\n\r\n" + body
    )  # fmt: skip
    # 100 kB of a next request sent at once behind it (16 KiB may wait there).
    conn = open_held(timeouts_server.port, request + b"GET /" + b"x" * 100_000)
    held.append(conn)
    hold([conn], timeout=SLACK_S)
    assert conn.closed is not None
    assert conn.status() is None, bytes(conn.received[:200])  # closed, not answered
    assert closes(timeouts_server, "bytes_ahead") == 1


def test_a_whole_head_past_the_limits_in_one_write_gets_431_and_is_closed(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    before = closes(timeouts_server, "headers_too_large")
    # 3,000 headers in 94.5 KiB, in one write: h11's limit bounds only an incomplete head.
    too_many = many_headers_head(3_000, 20)
    too_long = many_headers_head(1, 20_000)
    held += [open_held(timeouts_server.port, head) for head in (too_many, too_long)]
    hold(held, timeout=SLACK_S)
    for conn in held:
        assert conn.closed is not None
        assert conn.status() == 431, bytes(conn.received[:200])
        assert json.loads(conn.body())["error"]["code"] == "request_headers_too_large"
    assert closes(timeouts_server, "headers_too_large") - before == 2
    assert chat(timeouts_server).status_code == 200


def test_heads_past_the_limits_hold_no_memory(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    # 200 connections, each a 58 KiB head and a body that never comes: they held
    # 68 MB that never came back. Now each is refused before it is parsed.
    rss_before = timeouts_server.rss_bytes()
    head = many_headers_head(2_000, 20, declared_body=10_000)
    assert len(head) > 58 * 1024
    for _ in range(200):
        held.append(open_held(timeouts_server.port, head + b" " * 100))
    hold(held, timeout=SLACK_S)
    assert all(conn.status() == 431 for conn in held), [c.status() for c in held]
    grown = timeout_safe_growth(timeouts_server, rss_before)
    assert grown < 10 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB"


def timeout_safe_growth(server: RunningServer, before: int) -> int:
    """RSS growth since ``before`` (the server frees the connections' memory on later
    turns of its loop: the smallest of a few looks)."""
    looks = []
    for _ in range(5):
        looks.append(server.rss_bytes() - before)
        time.sleep(0.1)
    return min(looks)


def test_content_length_and_transfer_encoding_together_get_400_and_close(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    body = chat_body()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    )
    conn = open_held(timeouts_server.port, request)
    held.append(conn)
    hold([conn], timeout=SLACK_S)
    assert conn.closed is not None  # not kept for another request
    assert conn.status() == 400, bytes(conn.received[:200])
    assert json.loads(conn.body())["error"]["code"] == "ambiguous_body_length"
    assert closes(timeouts_server, "ambiguous_length") >= 1


def test_only_trusted_callers_raise_their_priority(stormguard_server_factory: Any) -> None:
    # The peer's address decides, not an X-Forwarded-For it sends, unless the peer is
    # a proxy the operator named.
    peer_only, behind_proxy = stormguard_server_factory.together(
        spec("--trust-priority-from", "10.0.0.0/8"),
        spec("--trust-priority-from", "10.0.0.0/8", "--trust-forwarded-from", "127.0.0.1"),
    )
    ignored = "stormguard_priority_claims_ignored_total"

    def claim(server: RunningServer, forwarded_for: str) -> None:
        headers = {
            "content-type": "application/json",
            "x-priority": "critical",
            "x-forwarded-for": forwarded_for,
        }
        answer = httpx.post(
            server.url("/v1/chat/completions"), content=chat_body(), headers=headers, timeout=30
        )
        assert answer.status_code == 200, answer.text

    claim(peer_only, "10.1.2.3")  # from 127.0.0.1, which is not in 10.0.0.0/8
    assert peer_only.metric(ignored) == 1
    claim(behind_proxy, "10.1.2.3")  # the named proxy says the client is 10.1.2.3
    assert behind_proxy.metric(ignored) == 0
    claim(behind_proxy, "203.0.113.9")
    assert behind_proxy.metric(ignored) == 1


def test_idle_connections_past_the_limit_make_room_for_real_ones(
    stormguard_server_factory: Start, held: list[Held]
) -> None:
    server = stormguard_server_factory("--max-connections", "8", "--header-timeout-s", LONG_S)
    held += [open_held(server.port) for _ in range(16)]
    # Each newcomer past 8 closed the connection idle longest: the oldest ones.
    hold(held[:8], timeout=SLACK_S)
    assert_oldest_closed(held, at_least=8)
    for _ in range(3):
        assert chat(server).status_code == 200
    hold(held[8:9], timeout=SLACK_S)
    assert_oldest_closed(held, at_least=9)
    assert closes(server, "limit_idle") >= 9


def assert_oldest_closed(conns: list[Held], at_least: int) -> None:
    closed = [is_closed_now(conn) for conn in conns]
    assert sum(closed) >= at_least, closed
    assert closed == sorted(closed, reverse=True), f"not the oldest first: {closed}"


def test_past_the_limit_with_no_idle_connection_a_new_one_is_refused(
    stormguard_server_factory: Start, held: list[Held]
) -> None:
    server = stormguard_server_factory(
        "--max-connections", "4", "--header-timeout-s", LONG_S, "--body-timeout-s", LONG_S
    )
    held += [open_in_flight(server.port, 10_000, 10) for _ in range(4)]
    newcomer = open_held(server.port)
    held.append(newcomer)
    assert is_closed_now(newcomer, wait=SLACK_S), "a connection past the limit stayed open"
    assert newcomer.received == b""
    assert not any(is_closed_now(conn) for conn in held[:4])
    for conn in held[:4]:
        conn.close()
    assert eventually_ok(server)
    assert closes(server, "limit_full") >= 1


def test_requests_past_the_concurrency_limit_get_an_openai_503(
    stormguard_server_factory: Start, held: list[Held]
) -> None:
    server = stormguard_server_factory("--max-concurrent-requests", "2", "--body-timeout-s", LONG_S)
    held += [open_in_flight(server.port, 10_000, 10) for _ in range(2)]
    refused = chat(server)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "queue_full"
    assert "limit of 2 requests" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-load-shed"] == "queue_full"
    assert refused.headers["connection"] == "close"
    for conn in held:
        conn.close()
    assert eventually_ok(server)
    assert server.metric('stormguard_http_refused_total{limit="requests"}') >= 1
    # Counted with every other answer, as each 5xx is.
    route = 'route="/v1/chat/completions",status="503"'
    assert server.metric(f"stormguard_responses_total{{{route}}}") >= 1


def test_request_bodies_held_at_once_are_bounded(
    stormguard_server_factory: Start, held: list[Held]
) -> None:
    server = stormguard_server_factory(
        "--max-body-bytes", "100000", "--max-buffered-body-bytes", "250000",
        "--body-timeout-s", LONG_S,
    )  # fmt: skip
    held += [open_in_flight(server.port, 100_000, 50_000) for _ in range(2)]
    assert server.metric("stormguard_http_body_bytes_held") == 200_000
    # 200,000 of 250,000 bytes held: another 100 kB body is refused, a small one is not.
    refused = chat(server, chat_body(pad_to=100_000))
    assert refused.status_code == 503, refused.text
    assert "250000 bytes of request bodies" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"]
    assert chat(server).status_code == 200
    assert server.metric('stormguard_http_refused_total{limit="body_bytes"}') == 1
    for conn in held:  # their clients leave: the bytes are given back
        conn.close()
    assert settled(server, "stormguard_http_body_bytes_held", 0)
    assert chat(server, chat_body(pad_to=100_000)).status_code == 200


def test_a_timed_out_body_gives_its_bytes_back(
    timeouts_server: RunningServer, held: list[Held]
) -> None:
    # It holds every byte of the server's body budget (100 kB) until its 408.
    held.append(open_in_flight(timeouts_server.port, 100_000, 50_000))
    hold(held, timeout=BODY_TIMEOUT_S + SLACK_S)
    assert held[0].status() == 408
    assert settled(timeouts_server, "stormguard_http_body_bytes_held", 0)
    assert chat(timeouts_server, chat_body(pad_to=100_000)).status_code == 200


def eventually_ok(server: RunningServer, body: bytes | None = None) -> bool:
    """A normal request succeeds within the slack (a connection closed by its client
    is seen by the server on a later turn of its loop, not at once)."""
    deadline = time.monotonic() + SLACK_S
    while True:
        try:
            if chat(server, body).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
