"""The wire protocol's parsers: every odd input becomes None, never an exception."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import protocol
from stormguard.protocol import Priority, ServerLoad

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0"}, None),  # no wait is no advice: the caller's backoff applies
        ({"retry-after-ms": "0", "retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": " 7 "}, 7.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # ms wins
        ({"retry-after-ms": "abc", "retry-after": "9"}, 9.0),  # bad ms falls back
        ({"retry-after-ms": "-5", "retry-after": "2"}, 2.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "abc"}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "-inf"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "1e308"}, None),
        ({"retry-after": "9" * 400}, None),
        ({"retry-after": str(365 * 86400)}, None),  # a year: absurd
        ({"retry-after": "86400"}, 86400.0),  # one day: the limit
        ({"retry-after-ms": str(2 * 86400 * 1000)}, None),
        ({}, None),
    ],
)
def test_parse_retry_after_table(headers: dict[str, str], expected: float | None) -> None:
    assert protocol.parse_retry_after(headers, now=NOW) == expected


def test_retry_after_http_date_future_past_and_far() -> None:
    in_ten = email.utils.formatdate(NOW + 10, usegmt=True)
    assert protocol.parse_retry_after({"retry-after": in_ten}, now=NOW) == pytest.approx(10, abs=1)
    next_year = email.utils.formatdate(NOW + 366 * 86400, usegmt=True)
    assert protocol.parse_retry_after({"retry-after": next_year}, now=NOW) is None
    assert protocol.parse_retry_after({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}) is None
    assert protocol.parse_retry_after({"retry-after": "Mon, 99 Foo 2020 99:99:99 GMT"}) is None


@pytest.mark.parametrize("ahead", [-100.0, -0.5, 0.0, 0.4, 0.99])
def test_a_date_that_is_no_wait_is_no_advice(ahead: float) -> None:
    # A date in the past, or within the second its resolution allows: under clock
    # skew that is a zero wait, and every skewed client would retry in the same
    # instant instead of on its jittered backoff (openai-python and urllib3 back off).
    date = email.utils.formatdate(NOW, usegmt=True)
    assert protocol.parse_retry_after({"retry-after": date}, now=NOW - ahead) is None


def test_a_date_is_read_against_the_responses_own_date() -> None:
    # Both dates are the server's clock: a client an hour ahead (or behind) still
    # reads "in 10 s" as 10 s.
    headers = {
        "retry-after": email.utils.formatdate(NOW + 10, usegmt=True),
        "date": email.utils.formatdate(NOW, usegmt=True),
    }
    for skew in (-3600.0, -7.0, 0.0, 7.0, 3600.0):
        assert protocol.parse_retry_after(headers, now=NOW + skew) == 10.0
    headers["date"] = email.utils.formatdate(NOW + 10, usegmt=True)
    assert protocol.parse_retry_after(headers, now=NOW - 3600) is None  # "now": no wait
    headers["date"] = "not a date"
    assert protocol.parse_retry_after(headers, now=NOW) == pytest.approx(10, abs=1)


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(
        st.floats(min_value=-2 * 86_400, max_value=2 * 86_400).map(
            lambda ahead: email.utils.formatdate(NOW + ahead, usegmt=True)
        ),
        st.integers(min_value=-10, max_value=10**6).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(str),
        st.text(max_size=30),
    ),
    ms=st.none() | st.integers(min_value=-10, max_value=10**9).map(str),
    skew=st.floats(min_value=-86_400, max_value=86_400),
)
def test_a_retry_after_is_absent_or_a_real_wait_never_zero(
    value: str, ms: str | None, skew: float
) -> None:
    headers = {"retry-after": value} if ms is None else {"retry-after": value, "retry-after-ms": ms}
    wait = protocol.parse_retry_after(headers, now=NOW + skew)
    assert wait is None or 0 < wait <= protocol.ABSURD_RETRY_AFTER_S


def test_server_load_parses_every_header() -> None:
    load = ServerLoad.from_headers(
        {
            "x-queue-depth": "4",
            "x-queue-tokens": "9000",
            "x-inflight-tokens": "12000",
            "x-token-capacity": "16000",
            "x-kv-cache-usage": "0.75",
            "retry-after-ms": "1500",
            "x-should-retry": "FALSE",
            "x-load-shed": "Queue_Full",
        }
    )
    assert load == ServerLoad(4, 9000, 12000, 16000, 0.75, 1.5, False, "queue_full")
    assert not load.is_empty
    assert ServerLoad.from_headers({}).is_empty


@pytest.mark.parametrize(
    "bad",
    ["-1", "abc", "1.5", "", " ", "1e3", "٣", "9" * 40, "0x10", "+3"],
)
def test_malformed_integers_are_none(bad: str) -> None:
    load = ServerLoad.from_headers({"x-queue-depth": bad, "x-inflight-tokens": bad})
    assert load.queue_depth is None
    assert load.inflight_tokens is None


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "nan", "inf", "abc", ""])
def test_kv_usage_outside_zero_one_is_none(bad: str) -> None:
    assert ServerLoad.from_headers({"x-kv-cache-usage": bad}).kv_cache_usage is None


def test_should_retry_only_true_or_false() -> None:
    assert ServerLoad.from_headers({"x-should-retry": "true"}).should_retry is True
    assert ServerLoad.from_headers({"x-should-retry": "yes"}).should_retry is None


def test_to_headers_round_trips() -> None:
    load = ServerLoad(3, 100, 200, 1000, 0.5, 2.25, False, "token_budget")
    headers = load.to_headers()
    assert headers["retry-after"] == "3"  # whole seconds, rounded up
    assert headers["retry-after-ms"] == "2250"
    assert ServerLoad.from_headers(headers) == load


def test_format_retry_after_never_zero_or_negative() -> None:
    assert protocol.format_retry_after(0) == {"retry-after": "1", "retry-after-ms": "1"}
    assert protocol.format_retry_after(-5)["retry-after"] == "1"


def test_attempt_header_and_openai_retry_count() -> None:
    assert protocol.parse_attempt({"x-stormguard-attempt": "2"}) == 2
    assert protocol.parse_attempt({"x-stainless-retry-count": "0"}) == 1
    assert protocol.parse_attempt({"x-stainless-retry-count": "3"}) == 4
    assert protocol.parse_attempt({"x-stormguard-attempt": "0"}) is None
    assert protocol.parse_attempt({"x-stormguard-attempt": "x"}) is None
    assert protocol.parse_attempt({}) is None


def test_deadline_and_priority() -> None:
    assert protocol.parse_deadline_ms({"x-request-deadline-ms": "1500"}) == 1500.0
    assert protocol.parse_deadline_ms({"x-request-deadline-ms": "0"}) == 0.0
    assert protocol.parse_deadline_ms({"x-request-deadline-ms": "-1"}) is None
    assert protocol.parse_deadline_ms({"x-request-deadline-ms": "soon"}) is None
    assert protocol.parse_priority({"x-priority": "CRITICAL"}) is Priority.CRITICAL
    assert protocol.parse_priority({"x-priority": "urgent!!"}) is Priority.STANDARD
    assert protocol.parse_priority({}) is Priority.STANDARD
    assert [p.rank for p in Priority] == [0, 1, 2]


@given(
    st.dictionaries(
        st.sampled_from(
            (
                *protocol.LOAD_HEADERS,
                protocol.HEADER_RETRY_AFTER,
                protocol.HEADER_RETRY_AFTER_MS,
                protocol.HEADER_SHOULD_RETRY,
                protocol.HEADER_LOAD_SHED,
            )
        ),
        st.text(max_size=40),
    )
)
def test_any_header_text_parses_without_error(headers: dict[str, str]) -> None:
    load = ServerLoad.from_headers(headers)
    if load.retry_after is not None:
        assert 0 <= load.retry_after <= protocol.ABSURD_RETRY_AFTER_S
    if load.kv_cache_usage is not None:
        assert 0 <= load.kv_cache_usage <= 1


def test_plain_vllm_orca_header_fills_queue_depth_and_kv_usage() -> None:
    text = "TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=3.0"
    load = ServerLoad.from_headers({"endpoint-load-metrics": text})
    assert (load.queue_depth, load.kv_cache_usage) == (3, 0.25)
    as_json = 'JSON {"named_metrics": {"kv_cache_usage_perc": 0.5, "num_requests_waiting": 7}}'
    load = ServerLoad.from_headers({"endpoint-load-metrics": as_json})
    assert (load.queue_depth, load.kv_cache_usage) == (7, 0.5)
    # The protocol's own headers win when both are there.
    both = ServerLoad.from_headers({"endpoint-load-metrics": text, "x-queue-depth": "9"})
    assert both.queue_depth == 9 and both.kv_cache_usage == 0.25


@pytest.mark.parametrize(
    "bad",
    [
        "TEXT named_metrics.kv_cache_usage_perc=abc",
        "TEXT named_metrics.num_requests_waiting=-4",
        "TEXT named_metrics.kv_cache_usage_perc=7",
        "JSON {not json",
        'JSON ["named_metrics"]',
        "XML <a/>",
        "TEXT " + "named_metrics.x=1, " * 2000,
        "",
    ],
)
def test_malformed_orca_headers_are_ignored(bad: str) -> None:
    load = ServerLoad.from_headers({"endpoint-load-metrics": bad})
    assert load.queue_depth is None and load.kv_cache_usage is None
