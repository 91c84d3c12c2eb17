"""Request heads past the limits, and ambiguous framing, refused before the app.

h11 bounds only an *incomplete* head (``max_incomplete_event_size``): a whole
head that arrives in one read is parsed, whatever its size. So the server
measures the head before h11 parses it (connections.py); these tests drive the
protocol in-process (``http_wire.py``) with any bytes in any cuts. The same
bounds over real sockets: tests/e2e/test_hostile_client.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from stormguard_server.http import connections
from stormguard_server.http.connections import MAX_BYTES_AHEAD, ConnectionLimits
from tests.server.http.http_wire import Headers, Wire, many_headers, request_head

DEFAULTS = ConnectionLimits()


async def test_a_complete_head_past_the_byte_limit_in_one_read_gets_431_and_is_closed() -> None:
    head = request_head([(b"x-big", b"v" * 20_000)])  # one read, well past 16 KiB
    async with Wire(DEFAULTS) as wire:
        wire.receive(head)
        await wire.settle()
        assert wire.requests == 0  # the app never saw it
        assert wire.status() == 431
        assert wire.answer_headers()[b"connection"] == b"close"
        error = json.loads(wire.body())["error"]
        assert error["code"] == "request_headers_too_large"
        assert "16384 bytes" in error["message"]
        assert wire.transport.write_closed  # then closed (after a lingering read)


async def test_more_headers_than_the_count_limit_get_431() -> None:
    # The reported case: 3,000 headers, 94.5 KiB, in one write.
    head = request_head(many_headers(3_000, value_size=20))
    assert len(head) > 90_000
    async with Wire(DEFAULTS) as wire:
        wire.receive(head)
        await wire.settle()
        assert wire.requests == 0
        assert wire.status() == 431
        assert "100 header fields" in json.loads(wire.body())["error"]["message"]


async def test_many_small_headers_within_the_byte_limit_are_counted_too() -> None:
    head = request_head(many_headers(500, value_size=1))  # ~6 KiB: h11 alone takes it
    assert len(head) < DEFAULTS.max_header_bytes
    async with Wire(DEFAULTS) as wire:
        wire.receive(head)
        await wire.settle()
        assert (wire.requests, wire.status()) == (0, 431)


async def test_a_head_at_both_limits_is_served() -> None:
    headers = many_headers(DEFAULTS.max_header_count - 1, value_size=0)  # + Host
    pad = DEFAULTS.max_header_bytes - len(request_head(headers))
    head = request_head([*headers[:-1], (headers[-1][0], b"v" * pad)])
    assert len(head) == DEFAULTS.max_header_bytes
    async with Wire(DEFAULTS) as wire:
        wire.receive(head)
        await wire.settle()
        assert (wire.requests, wire.status()) == (1, 200)
        assert len(wire.heads[0]) == DEFAULTS.max_header_count


async def test_a_pipelined_head_past_the_limits_is_refused_when_its_turn_comes() -> None:
    # Sent behind a request being served: it waits unparsed (within the 16 KiB
    # ahead), then is measured like any head before h11 parses it.
    first = request_head([])
    second = request_head(many_headers(600, value_size=1))
    assert len(second) < DEFAULTS.max_header_bytes
    async with Wire(DEFAULTS) as wire:
        wire.receive(first + second)
        await wire.settle()
        assert wire.requests == 1
        assert wire.status() == 200
        assert b" 431 " in wire.transport.written


async def test_a_head_dripped_past_the_limit_gets_the_same_431() -> None:
    head = request_head([(b"x-big", b"v" * 20_000)])
    async with Wire(DEFAULTS) as wire:
        for start in range(0, len(head), 1000):
            wire.receive(head[start : start + 1000])
        await wire.settle()
        assert (wire.requests, wire.status()) == (0, 431)


async def test_content_length_and_transfer_encoding_together_get_400_and_close() -> None:
    # RFC 9112 6.1: such a request must not leave the connection open (a request
    # smuggled past a proxy that reads the other length). Rejected, as nginx and Envoy do.
    head = request_head(
        [(b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")],
        method=b"POST",
        target=b"/v1/chat/completions",
    )
    async with Wire(DEFAULTS) as wire:
        wire.receive(head + b"5\r\nhello\r\n0\r\n\r\n" + request_head([]))
        await wire.settle()
        assert wire.requests == 0  # neither it nor what followed reached the app
        assert wire.status() == 400
        assert wire.answer_headers()[b"connection"] == b"close"
        assert json.loads(wire.body())["error"]["code"] == "ambiguous_body_length"
        assert wire.transport.write_closed
        assert wire.transport.written.count(b"HTTP/1.1 ") == 1


async def test_lingering_ends_when_the_client_closes_or_after_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Wire(DEFAULTS) as wire:
        wire.receive(request_head(many_headers(200)))
        await wire.settle()
        assert wire.transport.write_closed and not wire.transport.closed
        wire.receive(b"x" * 100_000)  # still sending: read and dropped
        assert not wire.pending and wire.transport.written.count(b"HTTP/1.1") == 1
        assert wire.protocol.eof_received() is None  # asyncio then closes the transport
    monkeypatch.setattr(connections, "LINGER_S", 0.01)
    async with Wire(DEFAULTS) as wire:
        wire.receive(request_head(many_headers(200)))
        await wire.settle()
        assert not wire.transport.closed
        await asyncio.sleep(0.05)  # past the lingering time: closed without the client
        assert wire.transport.closed


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(min_value=0, max_value=400),
    value_size=st.integers(min_value=0, max_value=200),
    cuts=st.lists(st.integers(min_value=1, max_value=40_000), max_size=6),
)
async def test_whatever_the_head_the_app_sees_it_only_within_both_limits(
    count: int, value_size: int, cuts: list[int]
) -> None:
    limits = ConnectionLimits(max_header_bytes=8_192, max_header_count=150)
    head = request_head(many_headers(count, value_size))
    within = len(head) <= limits.max_header_bytes and count + 1 <= limits.max_header_count
    async with Wire(limits) as wire:
        at = 0
        for size in [*cuts, len(head)]:
            wire.receive(head[at : at + size])
            at += size
            if at >= len(head):
                break
        await wire.settle()
        if within:
            assert (wire.requests, wire.status()) == (1, 200)
        else:
            assert (wire.requests, wire.status()) == (0, 431)
            assert wire.transport.write_closed or wire.transport.closed


# Whatever a client sends on one connection: requests with any number and size of
# headers, bodies framed by length, by chunks or by both, in any cuts.

FRAMINGS = ("none", "length", "chunked", "none", "length", "chunked", "both")


@st.composite
def client_request(draw: st.DrawFn) -> tuple[bytes, Headers, str]:
    # Mostly within the bounds (so that several requests reach the app), now and then not.
    count = draw(st.one_of(st.integers(0, 10), st.integers(0, 90)))
    headers = many_headers(count, draw(st.one_of(st.integers(0, 20), st.integers(0, 150))))
    framing = draw(st.sampled_from(FRAMINGS))
    body = draw(st.binary(max_size=2_000))
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:7], body[7:]) if c)
    if framing in ("length", "both"):
        headers.append(
            (b"Content-Length", str(len(chunked if framing == "both" else body)).encode())
        )
    if framing in ("chunked", "both"):
        headers.append((b"Transfer-Encoding", b"chunked"))
    payload = {"none": b"", "length": body}.get(framing, chunked + b"0\r\n\r\n")
    method = b"GET" if framing == "none" else b"POST"
    return request_head(headers, method=method) + payload, headers, framing


@settings(max_examples=50, deadline=None)
@given(
    requests=st.lists(client_request(), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=1, max_value=30_000), max_size=8),
    settle_between=st.booleans(),
)
async def test_whatever_a_client_sends_the_bounds_hold(
    requests: list[tuple[bytes, Headers, str]], cuts: list[int], settle_between: bool
) -> None:
    limits = ConnectionLimits(max_header_bytes=4_096, max_header_count=60)
    stream = b"".join(raw for raw, _, _ in requests)

    def acceptable(raw: bytes, headers: Headers, framing: str) -> bool:
        head = raw[: raw.index(b"\r\n\r\n") + 4]
        return (
            len(head) <= limits.max_header_bytes
            and len(headers) + 1 <= limits.max_header_count
            and framing != "both"
        )

    def bounded(wire: Wire) -> None:  # after every read the protocol is handed
        if not (wire.transport.closed or wire.transport.write_closed):
            unparsed = len(wire.protocol.conn.trailing_data[0])
            assert unparsed <= max(limits.max_header_bytes, MAX_BYTES_AHEAD), unparsed

    async with Wire(limits) as wire:
        wire.after_read = bounded
        at = 0
        for size in [*cuts, len(stream)]:
            wire.receive(stream[at : at + size])
            at += size
            if settle_between:
                await wire.settle()
            if at >= len(stream):
                break
        await wire.settle(60)
        # The app saw a prefix of the requests, every one of them within the bounds.
        seen = wire.requests
        assert all(acceptable(*request) for request in requests[:seen])
        first_refused = next((i for i, r in enumerate(requests) if not acceptable(*r)), None)
        if first_refused is not None:
            assert seen <= first_refused
        for head in wire.heads:
            assert len(head) <= limits.max_header_count
        # Each request was answered, or the connection is closed (or closing).
        answers = wire.transport.written.count(b"HTTP/1.1 ")
        done = wire.transport.closed or wire.transport.write_closed
        event(f"served {seen} of {len(requests)}, closed: {done}")
        assert done or answers == len(requests), (answers, len(requests))
