"""The SSE decoder: line ends, comments, multi-line data, splits, partial events, limits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard._sse import EventTooLargeError, SSEDecoder

STREAM = (
    b": keep-alive\r\n\r\n"
    b'event: message\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line one\ndata: line two\n\n"
    b"data:no-space\r\rid: 7\ndata: [DONE]\n\n"
)


def decode_all(chunks: list[bytes]) -> list[tuple[str, str | None]]:
    decoder = SSEDecoder()
    out = []
    for piece in chunks:
        out.extend((e.data, e.event) for e in decoder.feed(piece))
    assert not decoder.has_partial_event
    return out


EXPECTED = [
    ('{"a": 1}', "message"),
    ("line one\nline two", None),
    ("no-space", None),
    ("[DONE]", None),
]


def test_mixed_line_ends_comments_and_multiline_data() -> None:
    assert decode_all([STREAM]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_into_chunks_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode_all(chunks) == EXPECTED


def test_cr_at_chunk_end_followed_by_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"\n") == []  # the LF belongs to the CR: no blank line yet
    assert [e.data for e in decoder.feed(b"\r\n")] == ["x"]


def test_partial_event_is_reported() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"choices": [') == []
    assert decoder.has_partial_event
    decoder2 = SSEDecoder()
    decoder2.feed(b"data: complete line\n")  # a line, but no blank line after it
    assert decoder2.has_partial_event


def test_event_without_data_dispatches_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: ping\n\n") == []
    assert not decoder.has_partial_event


def test_invalid_utf8_is_replaced_not_raised() -> None:
    [event] = SSEDecoder().feed(b"data: \xff\xfe ok\n\n")
    assert event.data.endswith(" ok")


def test_a_line_without_end_cannot_grow_past_the_limit() -> None:
    decoder = SSEDecoder(max_event_bytes=1024)
    decoder.feed(b"data: " + b"x" * 1000)
    with pytest.raises(EventTooLargeError):
        decoder.feed(b"x" * 100)


def test_many_lines_of_one_event_cannot_grow_past_the_limit() -> None:
    decoder = SSEDecoder(max_event_bytes=1024)
    with pytest.raises(EventTooLargeError):
        for _ in range(100):
            decoder.feed(b"data: " + b"y" * 50 + b"\n")
