"""The quota's arithmetic (quota.py), on a clock the test moves: buckets, charges,
refusals, the daily limit, the key table and its bound, the headers and Go durations."""

from __future__ import annotations

import hashlib
import math
import re
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard._core.rate_limit_headers import RateLimit
from stormguard_server.config import QuotaConfig
from stormguard_server.quota.buckets import (
    ANONYMOUS,
    MAX_LIMIT,
    Bucket,
    Quota,
    QuotaRefusal,
    go_duration,
    key_label,
)
from stormguard_server.quota.http import quota_message

SETTINGS = settings(max_examples=200, deadline=None)


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def quota(clock: Clock, **config: Any) -> Quota:
    return Quota(QuotaConfig(**config), clock=clock)


# -- the bucket -----------------------------------------------------------


def test_a_bucket_holds_its_capacity_and_refills_at_a_sixtieth_of_it_a_second() -> None:
    bucket = Bucket.full(600, now=0.0)
    assert bucket.rate == 10.0
    bucket.take(600, now=0.0)
    assert bucket.level_at(0.0) == 0.0
    assert bucket.level_at(1.5) == 15.0
    assert bucket.level_at(60.0) == 600.0
    assert bucket.level_at(3600.0) == 600.0  # never above capacity
    assert bucket.wait_for(25, now=1.5) == 1.0
    assert bucket.wait_for(15, now=1.5) == 0.0
    assert bucket.reset_in(now=1.5) == 58.5
    bucket.take(15, now=1.5)
    assert bucket.level_at(1.5) == 0.0
    assert bucket.reset_in(now=1.5) == 60.0


# -- charges and refusals -------------------------------------------------


def test_openais_own_numbers_come_out_to_the_millisecond() -> None:
    """ "Limit 30000, Used 29937, Requested 385. Please try again in 644ms": the 322
    tokens missing, at 500 a second."""
    clock = Clock()
    q = quota(clock, tokens_per_minute=30000)
    assert q.charge("k", 29937) is None
    refusal = q.charge("k", 385)
    assert refusal == QuotaRefusal("tokens", 30000, 29937, 385, pytest.approx(0.644))
    message = quota_message(refusal, model="gpt-4o", key="k")
    assert message == (
        "Rate limit reached for gpt-4o in organization org-k on tokens per min (TPM): "
        "Limit 30000, Used 29937, Requested 385. Please try again in 644ms. "
        "Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    clock.t += 0.643
    assert q.charge("k", 385) is not None
    clock.t += 0.001
    assert q.charge("k", 385) is None


def test_rpm_refusal_reads_as_openais() -> None:
    """ "Limit 3, Used 3, Requested 1. Please try again in 20s": one request refills in
    20 s at 3 a minute."""
    clock = Clock()
    q = quota(clock, requests_per_minute=3)
    for _ in range(3):
        assert q.charge("k", 10) is None
    refusal = q.charge("k", 10)
    assert refusal == QuotaRefusal("requests", 3, 3, 1, 20.0)
    assert "on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s." in (
        quota_message(refusal, model="m", key="k")
    )
    clock.t += 20
    assert q.charge("k", 10) is None


def test_a_refused_request_takes_nothing() -> None:
    clock = Clock()
    q = quota(clock, tokens_per_minute=600, requests_per_minute=60)
    assert q.charge("k", 590) is None
    before = q.rate_limit_headers("k")
    for _ in range(5):
        assert q.charge("k", 100) is not None
    assert q.rate_limit_headers("k") == before
    counts = dict(q.counts())["k"]
    assert (counts.admitted, counts.tokens_charged, counts.refused) == (1, 590, {"tokens": 5})


def test_over_both_limits_the_wait_is_for_the_one_that_frees_up_last() -> None:
    clock = Clock()
    q = quota(clock, tokens_per_minute=600, requests_per_minute=2)
    assert q.charge("k", 100) is None
    assert q.charge("k", 500) is None
    # Requests: one back in 30 s. Tokens: 100 back in 10 s.
    assert q.charge("k", 100) == QuotaRefusal("requests", 2, 2, 1, 30.0)
    clock.t += 30
    # Requests: one is back. Tokens: 300 back, 400 asked for: 10 s more.
    assert q.charge("k", 400) == QuotaRefusal("tokens", 600, 300, 400, pytest.approx(10.0))


def test_a_request_over_the_tpm_limit_itself_is_too_large_and_no_wait_helps() -> None:
    q = quota(Clock(), tokens_per_minute=1000)
    refusal = q.charge("k", 1001)
    assert refusal == QuotaRefusal("too_large", 1000, 0, 1001, None)
    assert quota_message(refusal, model="m", key="k") == (
        "Request too large for m in organization org-k on tokens per min (TPM): Limit 1000, "
        "Requested 1001. The input or output tokens must be reduced in order to run "
        "successfully. Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    assert q.charge("k", 1000) is None  # exactly the limit fits a full bucket


def test_the_daily_limit_spent_is_insufficient_quota_until_the_day_is_over() -> None:
    clock = Clock()
    q = quota(clock, tokens_per_day=1000)
    assert q.charge("k", 600) is None
    assert q.charge("k", 400) is None
    refusal = q.charge("k", 1)
    assert refusal == QuotaRefusal("insufficient_quota", 1000, 1000, 1, None)
    assert quota_message(refusal, model="m", key="k").startswith(
        "You exceeded your current quota, please check your plan and billing details."
    )
    clock.t += 86_399
    assert q.charge("k", 1) is not None
    clock.t += 1
    assert q.charge("k", 1000) is None


def test_forced_insufficient_quota_refuses_every_key() -> None:
    q = quota(Clock(), insufficient_quota=True)
    for key in ("a", "b", ANONYMOUS):
        assert q.charge(key, 1) == QuotaRefusal("insufficient_quota", 0, 0, 1, None)
    q.insufficient_quota = False
    assert q.charge("a", 1) is None


def test_two_keys_have_their_own_buckets() -> None:
    q = quota(Clock(), requests_per_minute=1)
    assert q.charge("a", 1) is None
    assert q.charge("a", 1) is not None
    assert q.charge("b", 1) is None
    assert q.rate_limit_headers("a")["x-ratelimit-remaining-requests"] == "0"
    assert q.rate_limit_headers("c")["x-ratelimit-remaining-requests"] == "1"


def test_the_key_table_is_bounded_and_drops_the_key_used_least_recently() -> None:
    q = quota(Clock(), requests_per_minute=1, max_keys=4)
    for key in "abcd":
        assert q.charge(key, 1) is None
    assert q.charge("a", 1) is not None  # a: used most recently now
    for key in "efghij":
        q.charge(key, 1)
    assert len(q) == 4
    assert q.evicted == 6
    assert [key for key, _ in q.counts()] == ["g", "h", "i", "j"]
    # Reading headers adds no key.
    for n in range(100):
        q.rate_limit_headers(f"reader-{n}")
    assert len(q) == 4


# -- headers --------------------------------------------------------------


def test_headers_as_openai_writes_them() -> None:
    clock = Clock()
    q = quota(clock, tokens_per_minute=150000, requests_per_minute=60)
    assert q.rate_limit_headers("k") == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "60",
        "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "150000",
        "x-ratelimit-reset-tokens": "0s",
    }
    assert q.charge("k", 16) is None
    assert q.rate_limit_headers("k") == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "7ms",
    }
    assert q.charge("k", 149984) is None
    assert q.rate_limit_headers("k")["x-ratelimit-reset-tokens"] == "1m0s"
    clock.t += 0.25
    headers = q.rate_limit_headers("k")
    assert headers["x-ratelimit-remaining-tokens"] == "625"
    assert headers["x-ratelimit-reset-tokens"] == "59.75s"
    # What the SDK reads back from them.
    read = RateLimit.from_headers(headers)
    assert (read.remaining_tokens, read.reset_tokens) == (625, 59.75)


def test_headers_only_for_the_limits_that_are_set_and_none_when_switched_off() -> None:
    assert set(quota(Clock(), tokens_per_minute=10).rate_limit_headers("k")) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }
    assert quota(Clock(), tokens_per_day=10).rate_limit_headers("k") == {}
    off = quota(Clock(), tokens_per_minute=10, requests_per_minute=1, headers=False)
    assert off.rate_limit_headers("k") == {}


# -- Go durations ---------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-1, "0s"),
        (math.nan, "0s"),
        (1e-9, "1ms"),
        (0.001, "1ms"),
        (0.0011, "2ms"),
        (0.02, "20ms"),
        (0.999, "999ms"),
        (0.9991, "1s"),
        (1, "1s"),
        (1.5, "1.5s"),
        (6.596, "6.596s"),
        (59.75, "59.75s"),
        (60, "1m0s"),
        (60.5, "1m0.5s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
        (3723.5, "1h2m3.5s"),
        (86_400, "24h0m0s"),
    ],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_GO_PART = r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)"


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration, as Go's ``time.ParseDuration`` reads one (unsigned)."""
    assert re.fullmatch(f"(?:{_GO_PART})+", text), text
    return sum(float(n) * _GO_UNITS[unit] for n, unit in re.findall(_GO_PART, text))


@SETTINGS
@given(seconds=st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_a_duration_formatted_then_parsed_comes_back_within_a_millisecond(seconds: float) -> None:
    """Rounded up, never down: a client that waits what it read finds what it was told."""
    parsed = parse_go_duration(go_duration(seconds))
    assert seconds - 1e-9 <= parsed <= seconds + 0.001


# -- keys -----------------------------------------------------------------


def test_the_key_is_the_bearer_token_or_azures_api_key() -> None:
    label = key_label({"authorization": "Bearer sk-abc"})
    assert len(label) == 12 and set(label) <= set(string.hexdigits)
    assert key_label({"authorization": "bearer   sk-abc  "}) == label
    assert key_label({"api-key": "sk-abc"}) == label
    # Authorization first; an empty one falls back to api-key.
    assert key_label({"authorization": "Bearer sk-abc", "api-key": "other"}) == label
    assert key_label({"authorization": "Bearer", "api-key": "sk-abc"}) == label
    assert key_label({"authorization": "Basic c2stYWJj"}) != label
    assert key_label({"authorization": "Bearer sk-abd"}) != label
    assert key_label({}) == key_label({"api-key": "  "}) == ANONYMOUS


@SETTINGS
@given(secret=st.text(min_size=1).filter(str.strip))
def test_a_label_is_a_short_hash_of_any_key(secret: str) -> None:
    """Any text, lone surrogates included, makes a label of 12 hex digits: the first
    ones of its SHA-256, which a reader can compute from a key and never the reverse."""
    for headers in ({"authorization": f"Bearer {secret}"}, {"api-key": secret}):
        expected = hashlib.sha256(secret.strip().encode("utf-8", "surrogatepass")).hexdigest()
        assert key_label(headers) == expected[:12]


# -- settings -------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"tokens_per_minute": 0},
        {"requests_per_minute": -1},
        {"tokens_per_day": MAX_LIMIT + 1},
        {"tokens_per_minute": 1.5},
        {"tokens_per_minute": True},
        {"default_max_tokens": -1},
        {"max_keys": 0},
    ],
)
def test_nonsense_limits_are_refused_when_the_quota_is_made(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Quota(QuotaConfig(**config))


def test_the_quota_is_off_unless_something_is_set() -> None:
    assert not QuotaConfig().enabled
    assert not QuotaConfig(retry_after="ms", headers=False, default_max_tokens=5).enabled
    assert QuotaConfig(tokens_per_minute=1).enabled
    assert QuotaConfig(requests_per_minute=1).enabled
    assert QuotaConfig(tokens_per_day=1).enabled
    assert QuotaConfig(insufficient_quota=True).enabled
