"""``parse_json_object``: a stream event's text is read with the standard decoder's
``raw_decode`` when it is one JSON value end to end, with ``json.loads`` otherwise;
either way the answer is ``json.loads``'s."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard._io.decoding import parse_json_object

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_AROUND = st.sampled_from(["", " ", "\n", "\t \r\n", "\ufeff", "x", "}", ",1", "[]"])


def _expected(text: str) -> Any:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@settings(max_examples=200, deadline=None)
@given(_JSON, _AROUND, _AROUND)
def test_text_reads_as_json_loads_reads_it(value: Any, before: str, after: str) -> None:
    text = before + json.dumps(value) + after
    assert parse_json_object(text) == _expected(text)


def test_a_text_event_with_whitespace_or_more_after_its_object() -> None:
    assert parse_json_object('{"a": 1}  \n') == {"a": 1}  # whitespace: still the object
    assert parse_json_object(' {"a": 1}') == {"a": 1}
    assert parse_json_object('{"a": 1}{"b": 2}') is None  # two values: not one object
    assert parse_json_object('{"a": 1} x') is None
    assert parse_json_object("[1]") is None
    assert parse_json_object("") is None
    assert parse_json_object("[" * 100_000) is None  # too deep: None, not RecursionError


def test_bytes_are_read_as_before() -> None:
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    assert parse_json_object('{"a": "é"}'.encode("utf-16")) == {"a": "é"}
    assert parse_json_object(b"\xff") is None
