"""The SSE decoder: line ends, comments, multi-line data, splits, partial events, limits."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard._io.sse import EventTooLargeError, SSEDecoder

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


def reference_events(stream: bytes) -> list[tuple[str, str | None, str | None]]:
    """The spec's algorithm, written plainly: the whole stream at once, one line at a
    time (slow, and obviously right)."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    *lines, _unterminated = re.split(rb"\r\n|\r|\n", stream)
    events, data, event, last_id = [], [], None, None
    for raw in lines:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if data:
                events.append(("\n".join(data), event, last_id))
            data, event = [], None
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            last_id = value
    return events


SSE_PIECES = st.sampled_from(
    [b"data", b"event", b"id", b":", b": ", b" ", b"x", b"\xc3", b"\0", b"\r", b"\n", b"\r\n"]
)


def decoded_in_pieces(stream: bytes, cuts: list[int]) -> list[tuple[str, str | None, str | None]]:
    """What one decoder makes of ``stream`` fed in pieces cut at ``cuts``."""
    points = sorted({c for c in cuts if c <= len(stream)})
    decoder = SSEDecoder()
    got = []
    for a, b in zip([0, *points], [*points, len(stream)], strict=True):
        got.extend((e.data, e.event, e.id) for e in decoder.feed(stream[a:b]))
    return got


@given(
    st.booleans(),
    st.lists(SSE_PIECES, max_size=60),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_the_decoder_agrees_with_the_spec_however_the_stream_is_cut(
    bom: bool, pieces: list[bytes], cuts: list[int]
) -> None:
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(pieces)
    assert decoded_in_pieces(stream, cuts) == reference_events(stream)


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_event() -> None:
    decoder = SSEDecoder()
    events = [*decoder.feed(b"\xef\xbb"), *decoder.feed(b"\xbfdata: first\n\ndata: x\n\n")]
    assert [e.data for e in events] == ["first", "x"]
    assert [e.data for e in SSEDecoder().feed(b"data: \xef\xbb\xbfkept\n\n")] == ["\ufeffkept"]


def test_events_around_a_flood_of_blank_lines_come_out_right() -> None:
    """A megabyte of newlines (or a gzip bomb of them) must not cost a search per line:
    linear time is shown in bench (docs/benchmarks.md); here, the events stay right."""
    decoder = SSEDecoder()
    events = decoder.feed(b"data: a\n" + b"\n" * 1_000_000 + b"data: b\r\n\r\n")
    assert [e.data for e in events] == ["a", "b"] and not decoder.has_partial_event


_EVENT_PARTS = st.one_of(
    st.text(max_size=20)
    .filter(lambda t: "\n" not in t and "\r" not in t)
    .map(lambda t: f"data: {t}\n\n".encode()),
    st.just(b": keep-alive\n\n"),
    st.just(b"event: note\ndata: x\n\n"),
    st.just(b"id: 9\n\n"),
    st.just(b"data: a\ndata: b\n\n"),
    st.just(b"data: cr\r\n\r\n"),
    st.just(b"data: open"),  # a line cut in the middle: the next piece goes on with it
)


@given(st.lists(_EVENT_PARTS, max_size=12))
def test_whole_events_as_pieces_decode_as_the_stream_cut_byte_by_byte(
    pieces: list[bytes],
) -> None:
    """A piece that is one whole single-line event (nearly every chunk of a real
    stream) takes a shorter way through the decoder; it must give what the general
    way gives for the same bytes, whatever came before it."""

    def decoded(chunks: list[bytes]) -> list[tuple[str, str | None, str | None]]:
        decoder = SSEDecoder()
        return [(e.data, e.event, e.id) for chunk in chunks for e in decoder.feed(chunk)]

    stream = b"".join(pieces)
    assert decoded(pieces) == decoded([stream[i : i + 1] for i in range(len(stream))])


def test_a_whole_event_past_the_limit_is_refused_with_what_came_before_it() -> None:
    decoder = SSEDecoder(max_event_bytes=64)
    assert decoder.feed(b": " + b"c" * 30 + b"\n") == []  # a comment counts as well
    with pytest.raises(EventTooLargeError):
        decoder.feed(b"data: " + b"x" * 40 + b"\n\n")


_BULK_PARTS = st.one_of(
    st.text(max_size=12)  # any text: multi-byte characters too, cut anywhere below
    .filter(lambda t: "\n" not in t and "\r" not in t)
    .map(lambda t: f"data: {t}\n\n".encode()),
    st.sampled_from(
        [
            b"data: \xc3\n\n",  # a cut UTF-8 sequence: replaced, alone or in a piece
            b"data: x\n\n\n\n",  # blank lines in a run
            b"data:x\n\n",  # no space after the colon
            b"data: a\ndata: b\n\n",  # two lines of one event
            b": keep-alive\n\n",
            b"event: note\ndata: x\n\n",
            b"id: 7\n\n",
            b"data: cr\r\n\r\n",
            b"\n",
        ]
    ),
)


@given(
    st.lists(_BULK_PARTS, max_size=30),
    st.lists(st.integers(min_value=0, max_value=600), max_size=6),
)
def test_a_piece_of_many_events_decodes_as_the_spec_says(
    parts: list[bytes], cuts: list[int]
) -> None:
    """Many events in one piece (a buffering proxy, a replay) take a way of their own
    when each is one data line; a piece with any other line in it, or cut anywhere
    (mid-line, mid-character, between the two LFs of an event), must decode as the
    spec's algorithm says."""
    stream = b"".join(parts)
    assert decoded_in_pieces(stream, cuts) == reference_events(stream)


def test_a_piece_of_events_cut_mid_event_or_between_its_line_ends() -> None:
    decoder = SSEDecoder()
    assert [e.data for e in decoder.feed(b"data: a\n\ndata: b\n\ndata: c")] == ["a", "b"]
    assert decoder.has_partial_event
    assert [e.data for e in decoder.feed(b"\n\ndata: d\n")] == ["c"]  # d's line, no blank
    assert [e.data for e in decoder.feed(b"\ndata: e\n\n")] == ["d", "e"]
    assert not decoder.has_partial_event


def test_an_event_of_another_shape_in_a_piece_of_many_is_read_in_order() -> None:
    events = SSEDecoder().feed(
        b"id: 1\n\ndata: a\n\nevent: error\ndata: {}\n\ndata: b\ndata: c\n\ndata: d\n\n"
    )
    assert [(e.data, e.event, e.id) for e in events] == [
        ("a", None, "1"),
        ("{}", "error", "1"),
        ("b\nc", None, "1"),
        ("d", None, "1"),
    ]


def test_an_event_past_the_limit_in_a_piece_of_many_is_refused() -> None:
    decoder = SSEDecoder(max_event_bytes=64)
    with pytest.raises(EventTooLargeError):
        decoder.feed(b"data: a\n\n" * 5 + b"data: " + b"x" * 60 + b"\n\n" + b"data: b\n\n")
    small = SSEDecoder(max_event_bytes=64)  # many small events: no event is too large
    assert len(small.feed(b"data: a\n\n" * 50)) == 50


def test_a_piece_of_100k_tiny_events_is_decoded_whole() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"data: x\n\n" * 100_000)
    assert len(events) == 100_000 and {e.data for e in events} == {"x"}
    assert not decoder.has_partial_event
