"""The quota pacer's modules alone, on virtual time: the share controller, the
429-learned rate, a 429's message, one key's quota with its waiters, the registry,
and a simulated key that P processes pace to."""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import QuotaPolicy, QuotaWaitError, RateLimit
from stormguard._policies.limiter.aimd import MAX_PAUSE_S
from stormguard._policies.quota import (
    KeyQuota,
    QuotaGate,
    QuotaKey,
    QuotaRegistry,
    estimate_cost,
    fingerprint,
    refusal_of,
    registry_for,
)
from stormguard._policies.quota._cubic import BETA, RECOVER_S, CubicRate
from stormguard._policies.quota._pace_bucket import PaceBucket
from stormguard._policies.quota._refusal_share import BETA as REFUSAL_BETA
from stormguard._policies.quota._refusal_share import GROWTH as REFUSAL_GROWTH
from stormguard._policies.quota._refusal_share import RECOVER_S as REFUSAL_RECOVER_S
from stormguard._policies.quota._refusal_share import RefusalShare
from stormguard._policies.quota._share import MIN_SHARE, STALE_S, ShareController
from stormguard._policies.quota._signals import Reading, Refusal, readings
from stormguard._policies.quota._tally import SendTally
from stormguard.testing import FakeClock
from tests.sdk.policies.quota import quota_sim

KEY = QuotaKey("abc123abc123", "api.test", "m")
FAR = math.inf
OPENAI_429 = (
    "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000,"
    " Used 29937, Requested 385. Please try again in 644ms. Visit"
    " https://platform.openai.com/account/rate-limits to learn more."
)


def share(**kw: float) -> ShareController:
    return ShareController(window=kw.get("window", 4.0), drain=8.0, reserve=0.02)


def tokens(limit: float, remaining: float) -> tuple[Reading, None]:
    return Reading("tokens", limit, remaining), None


# -- QuotaPolicy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"window": 0},
        {"drain": -1.0},
        {"reserve": 1.0},
        {"recheck": math.inf},
        {"retry_jitter": -0.1},
        {"max_paced_retries": -1},
        {"max_keys": 0},
        {"default_output_tokens": 2.5},
        {"window": math.nan},
    ],
)
def test_a_policy_refuses_values_it_cannot_pace_with(bad: dict[str, float]) -> None:
    with pytest.raises((ValueError, TypeError)):
        QuotaPolicy(**bad)  # type: ignore[arg-type]


def test_equal_policies_are_equal_and_hashable() -> None:
    assert QuotaPolicy() == QuotaPolicy() and hash(QuotaPolicy()) == hash(QuotaPolicy())


# -- ShareController: one dimension paced to the headers ---------------------------------


def test_a_dimension_paces_nothing_until_a_header_names_its_limit() -> None:
    dim = share()
    assert dim.wait(0.0, 10_000) == 0.0 and dim.least_wait(0.0, 10_000) == 0.0
    dim.take(500)
    assert dim.sent_total == 500


def test_the_first_header_guesses_the_share_from_what_this_process_sent() -> None:
    dim = share()
    dim.take(1_000)  # this process sent 1,000 of the 4,000 the key spent
    dim.observe(0.1, 0.5, 60_000, 56_000, 1_000)
    assert dim.share == pytest.approx(0.25)


def test_the_key_rate_is_the_refill_plus_the_surplus_drained() -> None:
    dim = share()
    dim.observe(0.0, 0.0, 60_000, 60_000, 0)  # rho = 1000/s, reserve 1,200
    assert dim.key_rate() == pytest.approx(1000 + (60_000 - 1_200) / 8)
    dim.observe(1.0, 1.0, 60_000, 600, 0)  # below the reserve: less than the refill
    assert dim.key_rate() == pytest.approx(1000 * (1 - 0.5 * 600 / 1200))


def test_a_measured_share_is_own_admitted_over_what_the_key_spent() -> None:
    dim = share()
    dim.take(1)
    # The key loses 2,000 a second net of its 1,000 refill: it spends 3,000 a second,
    # of which this process sends 1,000: a third.
    for i in range(9):
        t = i * 0.5
        dim.observe(t, t + 0.5, 60_000, 50_000 - 1_000 * i, 500 if i else 0)
    assert dim.share == pytest.approx(1 / 3, rel=0.1)


def _burst_then_paced(read_when_answering: bool) -> ShareController:
    """One of 16 processes on a 60,000 TPM key: 8 sends of 310 at t=0 before any
    header (128 in all, admitted in turn, this process's every 16th), then one paced
    send a second by each process; answers take 0.5 s."""
    dim = share()
    level = 60_000.0
    for k in range(128):
        level -= 310
        if k % 16 == 3:  # this process's: read as admitted, or all after the burst
            seen = 20_320 + 500 + k if read_when_answering else level
            dim.observe(0.001 * k, 0.5 + 0.001 * k, 60_000, seen, 310)
    for second in range(1, 5):
        dim.take(310)
        level = 20_320 + 1_000 * second - 16 * 310 * second
        seen = level + 500 if read_when_answering else level
        dim.observe(float(second), second + 0.5, 60_000, seen, 310)
    return dim


@pytest.mark.parametrize("read_when_answering", [False, True])
def test_a_burst_before_pacing_counts_once_whenever_the_provider_read_its_level(
    read_when_answering: bool,
) -> None:
    # Read as each request was admitted (OpenAI's may be), the burst's levels spread
    # over every process's part and measure from it; read when answering (the
    # reference server), they bunch after it, each with this process's 8 sends in:
    # counted again from there, the share read 0.5 and 16 processes sent 8 x the key.
    dim = _burst_then_paced(read_when_answering)
    assert dim.share == pytest.approx(1 / 16, rel=0.3)


def test_a_silent_share_doubles_per_window() -> None:
    dim = share()
    dim.take(100)
    dim.observe(0.0, 0.0, 60_000, 40_000, 100)  # first guess: 100 / 20,000
    low = dim.share
    assert dim.current_share(4.0) == low  # within a window: as measured
    assert dim.current_share(8.0) == pytest.approx(2 * low)
    assert dim.current_share(12.0) == pytest.approx(4 * low)
    assert dim.current_share(10_000.0) == 1.0


def test_the_local_bucket_paces_sends_to_the_share_of_the_key_rate() -> None:
    dim = share()
    dim.take(60_000 * 0.0)
    dim.observe(0.0, 0.0, 60_000, 1_200, 0)  # at the reserve: the refill, 1000/s
    dim.share = 0.5  # this process: 500/s
    assert dim.wait(0.0, 250) == pytest.approx(0.5)
    assert dim.wait(0.5, 250) == 0.0
    dim.take(250)
    assert dim.wait(0.5, 250) == pytest.approx(0.5)


def test_the_lower_bound_is_the_whole_key_refilling_at_its_rate() -> None:
    dim = share()
    dim.observe(0.0, 0.0, 6_000, 0, 0)  # 100 tokens a second
    assert dim.least_wait(0.0, 500) == pytest.approx(5.0)
    assert dim.least_wait(2.0, 500) == pytest.approx(3.0)
    assert dim.least_wait(0.0, 10**9) == pytest.approx(60.0)  # never past the limit


def test_a_share_read_between_429s_of_a_process_that_barely_sent_is_ignored() -> None:
    dim = share()
    dim.take(20_000)
    dim.observe(0.0, 0.0, 60_000, 1_200, 0, refusal=True)
    guess = dim.share
    dim.observe(3.0, 3.0, 60_000, 1_200, 0, refusal=True)  # nothing of its own between
    assert dim.share == guess > 0.3


# -- CubicRate: a rate learned from 429s alone ------------------------------------------


def test_without_headers_the_first_429_starts_from_what_this_process_sent() -> None:
    refusals = RefusalShare()
    refusals.start(10.0, 10.02, spent=40_000, own=8_000)  # a fifth of the key's spend
    assert refusals.share(10.02) == pytest.approx(0.2 * REFUSAL_BETA)  # the 429 cuts it
    refusals.counted(9.9, 2_000)  # an answer in flight when the 429 came: a quarter
    assert refusals.fair == pytest.approx(0.25)
    assert refusals.share(10.02) == pytest.approx(0.25 * REFUSAL_BETA)
    assert refusals.share(10.02 + REFUSAL_RECOVER_S) == pytest.approx(0.25)  # back to it
    refusals.counted(10.5, 2_000)  # sent after the 429: not part of what it found
    assert refusals.fair == pytest.approx(0.25)


def test_a_later_429_cuts_the_share_and_the_first_wave_is_old_news() -> None:
    refusals = RefusalShare()
    refusals.start(10.0, 10.02, spent=40_000, own=10_000)
    refusals.throttled(10.05, 10.01)  # sent before the first 429 came back: no cut
    assert refusals.share(10.05) == pytest.approx(0.25 * REFUSAL_BETA, rel=0.01)
    at = 10.02 + REFUSAL_RECOVER_S
    refusals.throttled(at, at - 0.1)
    assert refusals.share(at) == pytest.approx(0.25 * REFUSAL_BETA)
    # Past its old share the cubic grows it, by the whole key's GROWTH too.
    later = at + 2 * REFUSAL_RECOVER_S
    assert refusals.share(later) == pytest.approx(0.25 * (1 + 0.2) + REFUSAL_GROWTH)
    assert refusals.share(at + 100 * REFUSAL_RECOVER_S) == 1.0


@pytest.mark.parametrize("part", [MIN_SHARE, 1 / 64, 0.25])
def test_a_429_learned_share_is_whole_again_before_its_dimension_stops_pacing(part: float) -> None:
    # Past STALE_S without a 429 the dimension paces nothing: a share still below the
    # whole key then would let every waiting call go at once.
    refusals = RefusalShare()
    refusals.start(0.0, 0.0, spent=1.0, own=part)
    refusals.throttled(1.0, 0.5)
    assert refusals.share(1.0 + STALE_S) == 1.0


def test_without_a_count_of_its_sends_a_process_starts_whole() -> None:
    refusals = RefusalShare()
    refusals.start(1.0, 1.0, spent=0.0, own=0.0)
    assert refusals.share(1.0) == pytest.approx(REFUSAL_BETA)
    refusals.counted(0.5, 300)  # nothing to add to: the start counted nothing
    assert refusals.fair == 1.0


def test_a_tally_keeps_a_minute_of_sends_in_a_few_numbers() -> None:
    tally = SendTally()
    assert tally.reading(0.0) is None
    for i in range(600):  # a call every 0.1 s for a minute: 300 tokens each
        tally.add(100.0 + i * 0.1, 300)
    reading = tally.reading(160.0)
    assert reading is not None and reading.first == pytest.approx(100.0)
    assert reading.tokens == pytest.approx(600 * 300) and reading.requests == 600
    later = tally.reading(190.0)  # the first half minute has aged out
    assert later is not None and later.first >= 130.0 and later.requests < 400
    tally.add(10.0, 300)  # older than the minute kept: dropped
    assert tally.reading(190.0) == later
    assert len(tally._tokens) == 13


def test_a_pause_holds_the_local_bucket_so_its_end_releases_calls_at_the_rate() -> None:
    bucket = PaceBucket()
    bucket.start(0.0)
    assert bucket.wait(1.0, 100.0, 10) == 0.0  # 50 saved up (half a second's worth)
    bucket.hold(3.0)  # a 429's pause until t=3: nothing saved up through it
    assert bucket.wait(1.0, 100.0, 10) == pytest.approx(2.0 + 0.1)
    assert bucket.wait(3.0, 100.0, 10) == pytest.approx(0.1)
    bucket.take(10)
    assert bucket.wait(3.1, 100.0, 10) == pytest.approx(0.1)  # behind it, at the rate


def test_a_cubic_rate_is_off_until_the_first_throttle() -> None:
    cubic = CubicRate()
    for i in range(40):
        assert cubic.wait(i * 0.05, 100) == 0.0
        cubic.take(i * 0.05, 100)
    assert cubic.throttled(2.0, 1.9)
    assert cubic.on and cubic.w_max == pytest.approx(cubic.measured(2.0))
    assert cubic.rate(2.0) == pytest.approx(BETA * cubic.w_max)
    assert cubic.rate(2.0 + RECOVER_S) == pytest.approx(cubic.w_max)


def test_a_throttle_of_a_send_before_the_last_drop_is_old_news() -> None:
    cubic = CubicRate()
    cubic.take(0.0, 100)
    assert cubic.throttled(1.0, 0.5)
    w_max = cubic.w_max
    assert not cubic.throttled(1.1, 0.9) and cubic.w_max == w_max


def test_a_cubic_rate_grows_past_its_old_rate_only_up_to_twice_what_is_sent() -> None:
    cubic = CubicRate()
    for i in range(20):
        cubic.take(i * 0.1, 100)  # 1,000 a second
    cubic.throttled(2.0, 2.0)
    assert cubic.rate(100.0) <= max(2 * cubic.measured(100.0), cubic.w_max)


# -- what a 429 and a response say -------------------------------------------------------


def test_openai_s_429_message_names_the_limit_its_level_and_the_wait() -> None:
    refusal = refusal_of(OPENAI_429)
    assert refusal == Refusal("tokens", 30_000, 29_937, 385, 0.644)
    assert refusal.reading() == Reading("tokens", 30_000.0, 63.0)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "Requests to the ChatCompletions_Create Operation have exceeded token rate limit."
            " Please retry after 6 seconds.",
            Refusal(retry_in=6.0),
        ),
        (
            "on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 18.82s.",
            Refusal("requests", 3, 3, 1, 18.82),
        ),
        ("Please try again in 1m0.5s", Refusal(retry_in=60.5)),
        ("slow down", Refusal()),
        ("Limit 99999999999999999999, Used 1, Requested 1", Refusal()),
        ("Please try again in 999999h", Refusal()),
        ("", Refusal()),
        (None, Refusal()),
    ],
)
def test_a_429_message_is_read_or_ignored(message: str | None, expected: Refusal) -> None:
    assert refusal_of(message) == expected


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-limit-tokens": "0", "x-ratelimit-remaining-tokens": "0"},
        {"x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "101"},
        {"x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "-1"},
        {"x-ratelimit-limit-tokens": "inf", "x-ratelimit-remaining-tokens": "1"},
        {"x-ratelimit-limit-tokens": "1" * 20, "x-ratelimit-remaining-tokens": "1"},
        {"x-ratelimit-remaining-tokens": "5"},
    ],
)
def test_absurd_headers_read_as_nothing(headers: dict[str, str]) -> None:
    assert readings(RateLimit.from_headers(headers)) == (None, None)


# -- KeyQuota: one key, its waiters, its bounds ------------------------------------------


def key(**policy: float) -> KeyQuota:
    return KeyQuota(KEY, QuotaPolicy(**policy), random.Random(7))  # type: ignore[arg-type]


def paced(quota: KeyQuota, limit: float, remaining: float) -> KeyQuota:
    """``quota`` told the key's tokens, as the only process on it."""
    quota.observe(0.0, 0.0, tokens(limit, remaining), 0.0)
    quota.tokens.share, quota.tokens.share_t = 1.0, 10**6
    return quota


def test_a_key_without_a_signal_lets_every_call_go_at_once() -> None:
    quota = key()
    for i in range(100):
        pace = quota.reserve((1, i), 10_000, 0.0, FAR)
        assert pace.granted and pace.seconds == 0.0


def test_waiters_take_in_priority_then_arrival_order() -> None:
    quota = paced(key(), 6_000, 0)  # 100 tokens/s, nothing left
    sheddable = quota.reserve((2, 1), 100, 0.0, FAR)
    standard = quota.reserve((1, 2), 100, 0.0, FAR)
    critical = quota.reserve((0, 3), 100, 0.0, FAR)
    assert not (sheddable.granted or standard.granted or critical.granted)
    assert sheddable.seconds <= 0.5 and critical.seconds <= 0.5
    granted: list[tuple[int, int]] = []
    now = 0.0
    for _ in range(200):
        now += 0.05
        for ticket in [(2, 1), (1, 2), (0, 3)]:
            if ticket in granted:
                continue
            if quota.reserve(ticket, 100, now, FAR).granted:
                granted.append(ticket)
    assert granted == [(0, 3), (1, 2), (2, 1)]


def test_a_call_behind_others_waits_for_their_costs_too() -> None:
    quota = paced(key(recheck=100.0), 6_000, 0)
    first = quota.reserve((1, 1), 500, 0.0, FAR)
    second = quota.reserve((1, 2), 500, 0.0, FAR)
    assert second.seconds > first.seconds


def test_a_call_whose_deadline_even_the_whole_key_cannot_meet_fails_at_once() -> None:
    quota = key()
    quota.observe(0.0, 0.0, tokens(6_000, 0), 0.0)  # 100 tokens/s, empty
    with pytest.raises(QuotaWaitError) as info:
        quota.reserve((1, 1), 1_000, 0.0, 5.0)  # needs 10 s at the whole key's rate
    err = info.value
    assert err.least_wait == pytest.approx(10.0) and err.remaining == 5.0
    assert err.key == KEY.fingerprint and err.retry_stopped_by is None
    assert "abc123abc123" in str(err) and "6000 tokens/min" in str(err)
    assert quota.snapshot(0.0).refused == 1 and quota.snapshot(0.0).waiting == 0


def test_a_call_that_fits_the_key_but_not_its_share_waits_and_fails_at_its_deadline() -> None:
    quota = key()
    quota.observe(0.0, 0.0, tokens(6_000, 6_000), 0.0)
    quota.tokens.share = MIN_SHARE  # another 255 processes spend the key
    quota.tokens.share_t = 100.0
    now, pace = 0.0, quota.reserve((1, 1), 1_000, 0.0, 2.0)
    while True:
        assert not pace.granted and 0 < pace.seconds <= 0.5
        now += pace.seconds
        try:
            pace = quota.reserve((1, 1), 1_000, now, 2.0)
        except QuotaWaitError as err:
            assert err.wait is not None and err.wait > err.remaining
            break
    assert now == pytest.approx(2.0)


def test_a_429_pauses_the_key_for_its_wait_jittered_and_never_past_the_bound() -> None:
    quota = key()
    pause = quota.refused(0.0, 1.0, Refusal(), 2.0, False)
    assert 2.0 <= pause <= 3.0
    assert quota.reserve((1, 1), 1, 1.0, FAR).seconds <= 0.5  # re-ask within the recheck
    assert quota.least_wait(1.0, 1) == pytest.approx(2.0)  # the floor is unjittered
    assert quota.refused(0.0, 1.0, Refusal(), 10**9, False) <= MAX_PAUSE_S
    assert quota.snapshot(1.0).paused_for <= MAX_PAUSE_S


def test_a_429_wins_over_headers_that_say_there_is_room() -> None:
    quota = key()
    full = (Reading("tokens", 10**12, 10**12), Reading("requests", 10**9, 10**9))
    quota.observe(0.0, 0.0, full, 0.0)
    for i in range(10):
        assert quota.reserve((1, i), 100, i * 0.01, FAR).granted
    quota.refused(0.05, 0.1, Refusal(), 1.0, True)
    pace = quota.reserve((1, 99), 100, 0.1, FAR)
    assert not pace.granted
    assert quota.cubic.on  # and from now on the 429-learned rate caps the headers'


def test_no_call_is_held_past_the_pause_bound_whatever_the_headers_said() -> None:
    quota = key()
    quota.observe(0.0, 0.0, tokens(1, 0), 0.0)  # "one token a minute"
    quota.tokens.share = MIN_SHARE
    quota.tokens.share_t = 10**6
    now, waited = 0.0, 0.0
    while True:
        pace = quota.reserve((1, 1), 300, now, FAR, waited)
        now, waited = now + pace.seconds, waited + pace.seconds
        if pace.granted:
            break
    assert waited == pytest.approx(MAX_PAUSE_S)


def test_a_call_past_the_pause_bound_keeps_its_place_in_line() -> None:
    # 10 tokens a second, none left. An earlier call waits its turn; a later, larger
    # one whose wait passes the bound must queue behind it, not jump to the head:
    # put there out of order, it hid the earlier call from the line, which asked,
    # was not found, and went in again, and every call of the key spun for 36 s.
    quota = key()
    quota.observe(0.0, 0.0, tokens(600, 0), 0.0)
    early, late = (1, 5), (1, 10)
    assert not quota.reserve(early, 20, 0.0, FAR).granted
    assert not quota.reserve(late, 2_000, 0.0, FAR, waited=30.0).granted  # > 60 s in all
    assert quota._order == [early, late]
    assert not quota.reserve(early, 20, 0.5, FAR).granted or quota._order == [late]
    assert quota._order in ([early, late], [late])


def test_calls_that_waited_their_turn_past_the_pause_bound_still_go_one_by_one() -> None:
    # 10 tokens a second, none left, and 8 calls of 100 in line: the last one's turn
    # is more than a minute away. The bound is on the line standing still, not on
    # each call's wait: when every call's own minute ran out together, all of them
    # went at once (6 at 60 s here), and 16 such processes sent 8 calls each, every
    # minute, into a key that had room for one.
    quota = paced(key(), 600, 0)
    asks = [(0.0, i, 0.0) for i in range(8)]
    sent: list[float] = []
    while asks:
        now, i, waited = heapq.heappop(asks)
        pace = quota.reserve((1, i), 100, now, FAR, waited)
        if pace.granted:
            sent.append(now + pace.seconds)
            quota.observe(sent[-1], sent[-1] + 0.5, tokens(600, 0), 100)  # its answer
        else:
            heapq.heappush(asks, (now + pace.seconds, i, waited + pace.seconds))
    gaps = [b - a for a, b in itertools.pairwise([0.0, *sent])]
    assert len(sent) == 8 and sent[-1] > MAX_PAUSE_S
    assert min(gaps) >= 10.0 - 1e-6, sent  # never faster than the key's whole rate
    assert max(gaps) <= MAX_PAUSE_S + 1e-6, sent


def test_a_waiter_that_stops_asking_is_swept_out_and_keeps_no_one_waiting() -> None:
    quota = paced(key(), 6_000, 0)
    quota.reserve((0, 1), 100, 0.0, FAR)  # a critical call, then silence
    assert quota.snapshot(0.0).waiting == 1
    now = 0.0
    while not quota.reserve((1, 2), 100, now, FAR).granted:
        now += 0.5
    assert now <= 5.0 and quota.snapshot(now).waiting == 0


def test_withdraw_and_refund_give_back_the_place_and_the_cost() -> None:
    quota = key()
    quota.observe(0.0, 0.0, tokens(6_000, 1_000), 0.0)
    quota.tokens.share, quota.tokens.share_t = 1.0, 100.0
    assert quota.reserve((1, 1), 50, 0.0, FAR).granted
    before = quota.tokens.wait(0.0, 1)
    quota.refund(50)
    assert quota.tokens.wait(0.0, 1) <= before
    quota.reserve((1, 2), 5_000, 0.0, FAR)
    assert quota.snapshot(0.0).waiting == 1
    quota.withdraw((1, 2))
    assert quota.snapshot(0.0).waiting == 0


def test_too_many_waiters_fail_at_once() -> None:
    quota = key(max_waiting=3)
    quota.observe(0.0, 0.0, tokens(6_000, 0), 0.0)
    for i in range(3):
        quota.reserve((1, i), 100, 0.0, FAR)
    with pytest.raises(QuotaWaitError, match="max_waiting"):
        quota.reserve((1, 99), 100, 0.0, FAR)


def test_threads_share_a_key_without_losing_a_grant() -> None:
    quota = key()
    quota.observe(0.0, 0.0, tokens(60_000, 60_000), 0.0)
    granted: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(200):
            if quota.reserve((1, n * 1000 + i), 1, 0.0, FAR).granted:
                with lock:
                    granted.append(1)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # No torn state: every grant took its cost from the local bucket, empty at t=0.
    assert quota.tokens._bucket.level == pytest.approx(-len(granted))
    assert quota.snapshot(0.0).waiting + len(granted) <= 800


# -- hostile headers (hypothesis) --------------------------------------------------------


def _ask_until_it_goes_or_fails(quota: KeyQuota, cost: int, now: float) -> float:
    """Ask for ``cost`` as a call with 30 s left would, sleeping each answer, until it
    may go or fails; each sleep is bounded and the whole within the deadline and the
    pause bound. Returns the time it ended at."""
    deadline = now + 30.0
    waited, ticket = 0.0, (1, 1)
    while True:
        try:
            pace = quota.reserve(ticket, cost, now, deadline, waited)
        except QuotaWaitError as err:
            assert err.remaining < err.least_wait or now >= deadline or "max_waiting" in str(err)
            assert now <= deadline
            break
        assert 0.0 <= pace.seconds <= 0.5 + 1e-9 and math.isfinite(pace.seconds)
        now, waited = now + pace.seconds, waited + pace.seconds
        if pace.granted:
            break
    assert now <= deadline + 1e-9 and waited <= MAX_PAUSE_S + 1e-9
    return now


_VALUES = st.one_of(
    st.sampled_from(["0", "-1", "inf", "nan", "1" * 20, "1e9", "", " ", "365d", "8760h"]),
    st.integers(min_value=-5, max_value=10**19).map(str),
    st.text(max_size=8),
)
_NAMES = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
]


@settings(max_examples=150, deadline=None)
@given(
    answers=st.lists(st.dictionaries(st.sampled_from(_NAMES), _VALUES), min_size=1, max_size=6),
    refused=st.lists(st.booleans(), min_size=6, max_size=6),
    retry_after=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    cost=st.integers(min_value=1, max_value=10**7),
)
def test_no_answer_stalls_a_call_past_its_deadline_or_the_pause_bound(
    answers: list[dict[str, str]],
    refused: list[bool],
    retry_after: float | None,
    cost: int,
) -> None:
    quota = key()
    now = 0.0
    for i, headers in enumerate(answers):
        rate_limit = RateLimit.from_headers(headers)
        found = readings(rate_limit)
        quota.observe(now, now + 0.1, found, 0.0 if refused[i] else cost)
        if refused[i]:
            wait = retry_after if retry_after is not None and math.isfinite(retry_after) else None
            quota.refused(now, now + 0.1, Refusal(), wait, found != (None, None))
            # A 429 always wins: the next call waits at least its pause's floor.
            assert quota.least_wait(now + 0.1, 1) > 0 or (wait is not None and wait < 1e-3)
        now += 0.2
    _ask_until_it_goes_or_fails(quota, cost, now)


_NUMBER = st.one_of(st.integers(min_value=0, max_value=10**15), st.sampled_from([0, 1, 10**15]))


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(
        st.tuples(st.sampled_from(["tokens", "requests"]), _NUMBER, _NUMBER, _NUMBER),
        min_size=1,
        max_size=6,
    ),
    before=st.lists(
        st.tuples(st.floats(min_value=-100, max_value=10), st.integers(0, 10**9)), max_size=5
    ),
    cost=st.integers(min_value=1, max_value=10**7),
)
def test_no_429_message_stalls_a_call_past_its_deadline_or_the_pause_bound(
    messages: list[tuple[str, int, int, int]], before: list[tuple[float, int]], cost: int
) -> None:
    # No headers: absurd limits and levels in the 429s' messages ("Limit 0", "Used"
    # over the limit, 15 digits) and whatever this process sent before.
    tally = SendTally()
    for t_send, charged in before:
        tally.add(t_send, charged)
    quota = KeyQuota(KEY, QuotaPolicy(), random.Random(7), tally)
    now = 10.0
    for dimension, limit, used, requested in messages:
        refusal = Refusal(dimension, limit, used, requested, None)  # type: ignore[arg-type]
        quota.refused(now - 0.05, now, refusal, 1.0, False)
        quota.observe(now, now + 0.5, (None, None), float(cost))
        now += 1.5
    now = _ask_until_it_goes_or_fails(quota, cost, now)
    share = quota.snapshot(now).share_tokens
    assert MIN_SHARE <= share <= 1.0


# -- the registry ------------------------------------------------------------------------


def test_a_fingerprint_is_the_reference_server_s_label_and_never_the_key() -> None:
    assert fingerprint("sk-my-key") == "322ad2605eaf"  # docs/server.md's session
    assert "sk-my-key" not in fingerprint("sk-my-key")


def test_the_registry_keeps_at_most_max_keys_least_recently_used_first_out() -> None:
    registry = QuotaRegistry(QuotaPolicy(max_keys=1024))
    busy = registry.activate(QuotaKey("busy", "h", "m"))
    busy.observe(0.0, 0.0, tokens(60, 0), 0.0)
    busy.reserve((1, 1), 100, 0.0, FAR)  # a call waits on it: it stays
    for i in range(3_000):
        registry.activate(QuotaKey(f"k{i}", "h", "m"))
    assert len(registry) == 1024 and registry.evicted == 3_000 - 1023
    assert registry.get(QuotaKey("busy", "h", "m")) is busy
    assert registry.get(QuotaKey("k2999", "h", "m")) is not None
    assert registry.get(QuotaKey("k0", "h", "m")) is None


def test_answers_before_pacing_are_tallied_per_key_bounded_and_handed_to_its_quota() -> None:
    registry = QuotaRegistry(QuotaPolicy(max_keys=8))
    key_a = QuotaKey("a", "h", "m")
    for i in range(4):
        registry.unpaced(key_a, 1.0 + i, 1.5 + i, 300)
    for i in range(100):  # other keys: the tallies stay bounded
        registry.unpaced(QuotaKey(f"k{i}", "h", "m"), 1.0, 1.5, 1)
    assert len(registry._tallies) == 8 and key_a not in registry._tallies
    for i in range(4):
        registry.unpaced(key_a, 1.0 + i, 1.5 + i, 300)
    state = registry.activate(key_a)
    assert isinstance(state, KeyQuota) and key_a not in registry._tallies
    # The first 429: this process sent 1,200 of the 6,000 the key spent since t=1.
    message = Refusal("tokens", 6_000, 6_000 - 300, 300, None)
    state.refused(4.5, 4.6, message, 1.0, False)
    assert state.tokens.refusals.fair == pytest.approx(1_200 / (5_700 + 100 * 3.5))
    # An answer of a call sent before the 429, arriving now, goes to the quota.
    registry.unpaced(key_a, 4.4, 4.9, 300)
    assert state.tokens.refusals.fair == pytest.approx(1_500 / (5_700 + 100 * 3.5))


def test_clients_on_one_clock_and_policy_share_a_registry_and_others_do_not() -> None:
    clock, other = FakeClock(), FakeClock()
    one = registry_for(QuotaPolicy(), clock, clock.now)
    assert registry_for(QuotaPolicy(), clock, clock.now) is one
    assert registry_for(QuotaPolicy(window=2.0), clock, clock.now) is not one
    assert registry_for(QuotaPolicy(), other, other.now) is not one


# -- a simulated key, paced to by P processes --------------------------------------------


@pytest.mark.parametrize("processes", [1, 4, 16])
@pytest.mark.parametrize("bound", ["tpm", "rpm"])
def test_processes_converge_on_their_shares_of_a_key_that_sends_headers(
    processes: int, bound: str
) -> None:
    limits = {"tpm": 60_000, "rpm": 10_000} if bound == "tpm" else {"tpm": 10**7, "rpm": 200}
    outcome = quota_sim.run(processes=processes, **limits)  # type: ignore[arg-type]
    assert outcome.ok == outcome.calls and outcome.failed == 0
    assert outcome.refused <= 2  # 0 in simulation; a little room
    assert outcome.x_ideal <= 1.2


@pytest.mark.parametrize("processes", [4, 16])
@pytest.mark.parametrize("bound", ["tpm", "rpm"])
def test_processes_converge_when_the_provider_reads_its_level_as_it_answers(
    processes: int, bound: str
) -> None:
    # The reference server writes x-ratelimit-remaining when it answers, after every
    # request sent meanwhile; and a loaded host sends up to 0.1 s after it stamps.
    limits = {"tpm": 60_000, "rpm": 10_000} if bound == "tpm" else {"tpm": 10**7, "rpm": 200}
    outcome = quota_sim.run(
        processes=processes, read_at="response", delay=0.1, stagger=0.06, **limits
    )  # type: ignore[arg-type]
    assert outcome.ok == outcome.calls and outcome.failed == 0
    assert outcome.refused <= 2  # 0 in simulation (28-35 before the burst counted once)
    assert outcome.x_ideal <= 1.2


@pytest.mark.parametrize("processes", [1, 4, 16])
@pytest.mark.parametrize("retry_after", ["seconds", "none"])
@pytest.mark.parametrize("bound", ["tpm", "rpm"])
def test_processes_pace_to_a_key_that_sends_only_429s(
    processes: int, retry_after: str, bound: str
) -> None:
    limits = {"tpm": 60_000, "rpm": 10_000} if bound == "tpm" else {"tpm": 10**7, "rpm": 200}
    outcome = quota_sim.run(processes=processes, headers=False, retry_after=retry_after, **limits)  # type: ignore[arg-type]
    assert outcome.ok == outcome.calls
    # Each process must meet its own first 429 (and the one or two sent before it came
    # back): ~2 a process. After it, the share it had of the key before (RefusalShare)
    # holds it to its part: 6-10 429s in all with 4 processes, 41-43 with 16 (the
    # share measured between 429s: 26-52 and 106-287).
    assert outcome.refused <= {1: 2, 4: 15, 16: 60}[processes]
    assert outcome.x_ideal <= 1.3


def test_a_deadline_the_key_cannot_meet_fails_calls_instead_of_parking_them() -> None:
    # 300 calls of 315 tokens on 6,000 TPM need ~16 minutes; 20 s deadlines.
    outcome = quota_sim.run(processes=2, tpm=6_000, rpm=10_000, deadline=20.0)
    assert outcome.failed > 0 and outcome.ok + outcome.failed == outcome.calls
    assert outcome.refused <= 10  # of ~60 requests; the first burst goes unpaced


# -- the gate: a call's key, cost and place ----------------------------------------------


def gate() -> QuotaGate:
    return QuotaGate(QuotaPolicy(), FakeClock())


def test_a_call_s_key_is_its_credential_s_fingerprint_the_host_and_the_model() -> None:
    quotas = gate()
    one = quotas.key_for("Bearer sk-one", "api.test", "m")
    assert one == QuotaKey(fingerprint("sk-one"), "api.test", "m", True)
    assert quotas.key_for("sk-one", "api.test", "m") == one  # Azure's api-key: no scheme
    assert quotas.key_for("Bearer sk-two", "api.test", "m") != one
    assert quotas.key_for("Bearer sk-one", "api.test", "m2") != one
    assert quotas.key_for("Bearer sk-one", "other.test", "m") != one
    anonymous = quotas.key_for(None, "api.test", "m")
    assert not anonymous.keyed and anonymous.fingerprint == fingerprint("host:api.test")
    assert "sk-one" not in repr(one)


def test_a_call_s_cost_is_its_prompt_plus_its_output_charge() -> None:
    body = {"model": "m", "max_completion_tokens": 100}
    assert estimate_cost(body, b"x" * 400, embeddings=False, default_output=256) == 200
    assert estimate_cost({}, b"x" * 400, embeddings=False, default_output=256) == 356
    assert estimate_cost({}, b"x" * 400, embeddings=True, default_output=256) == 100
    checked = estimate_cost(body, b"", embeddings=False, default_output=1, precheck=(30, 70))
    assert checked == 100


def test_a_key_s_prompt_scale_follows_what_the_provider_counted() -> None:
    quotas = gate()
    key, other = (quotas.key_for(f"Bearer sk-{n}", "h", "m") for n in ("one", "two"))
    assert quotas.prompt_scale(key) == 1.0  # nothing counted yet: bytes / 4
    quotas.calibrate(key, 100.0, 80.0)
    assert quotas.prompt_scale(key) == pytest.approx(0.8)  # the first count is taken whole
    quotas.calibrate(key, 100.0, 100.0)
    assert quotas.prompt_scale(key) == pytest.approx(0.8 + 0.3 * 0.2)  # then a step
    assert quotas.prompt_scale(other) == 1.0  # per key
    body = {"max_tokens": 50}
    scaled = estimate_cost(body, b"x" * 400, embeddings=False, default_output=1, prompt_scale=0.5)
    assert scaled == 100  # 400 bytes / 4 x 0.5 + 50


@pytest.mark.parametrize(
    ("estimated", "counted", "scale"),
    [
        (100.0, 1e12, 4.0),
        (100.0, 1e-9, 0.25),
        (0.0, 50.0, 1.0),
        (100.0, 0.0, 1.0),
        (100.0, -5.0, 1.0),
        (100.0, math.nan, 1.0),
        (math.inf, 50.0, 1.0),
    ],
)
def test_an_absurd_count_moves_the_scale_no_further_than_its_bounds(
    estimated: float, counted: float, scale: float
) -> None:
    quotas = gate()
    key = quotas.key_for("Bearer sk-one", "h", "m")
    quotas.calibrate(key, estimated, counted)
    assert quotas.prompt_scale(key) == scale


def test_the_scales_are_bounded_by_max_keys_and_keep_the_latest() -> None:
    quotas = QuotaGate(QuotaPolicy(max_keys=3), FakeClock())
    keys = [quotas.key_for(f"Bearer sk-{n}", "h", "m") for n in range(5)]
    for key in keys:
        quotas.calibrate(key, 100.0, 50.0)
    assert len(quotas._scales) == 3
    assert [quotas.prompt_scale(k) for k in keys] == [1.0, 1.0, 0.5, 0.5, 0.5]


def test_a_call_pays_nothing_until_its_key_sends_a_quota_signal() -> None:
    quotas = gate()
    call = quotas.call(quotas.key_for("Bearer sk-one", "h", "m"), 1)
    assert call.pace(300, 0.0, FAR) is None and call.state() is None
    call.observe(0.0, 0.5, RateLimit(), 300)  # no headers: still nothing
    assert quotas.registry.get(call.key) is None
    call.observe(0.0, 0.5, RateLimit(limit_tokens=6_000, remaining_tokens=0), 300)
    assert quotas.registry.get(call.key) is call.state() is not None
    assert quotas.snapshot()[0].limit_tokens == 6_000


def test_a_quota_429_waits_its_retry_after_else_its_message_else_the_reset() -> None:
    quotas = gate()
    for retry_after, message, reset, expected in [
        (3.0, OPENAI_429, 9.0, 3.0),
        (None, OPENAI_429, 9.0, 0.644),
        (None, "slow down", 9.0, 9.0),
        (None, "slow down", None, 1.0),
    ]:
        call = quotas.call(quotas.key_for(f"Bearer {expected}", "h", "m"), 1)
        spent = RateLimit(remaining_tokens=0, reset_tokens=reset)
        pause = call.refused(0.0, 0.0, message, retry_after, spent)
        assert expected <= pause <= expected * 1.5
        assert call.paced == 1


def test_a_call_that_leaves_gives_back_its_place_and_what_it_never_sent() -> None:
    quotas = gate()
    call = quotas.call(quotas.key_for("Bearer sk", "h", "m"), 1)
    call.observe(0.0, 0.0, RateLimit(limit_tokens=6_000, remaining_tokens=0), 0)
    state = call.state()
    assert state is not None
    pace = call.pace(300, 0.0, FAR)
    assert pace is not None and not pace.granted and state.snapshot(0.0).waiting == 1
    call.leave()
    assert state.snapshot(0.0).waiting == 0


def test_a_forked_child_forgets_the_parent_s_waiting_calls() -> None:
    quota = paced(key(), 6_000, 0)
    quota.reserve((0, 1), 100, 0.0, FAR)
    assert quota.snapshot(0.0).waiting == 1
    quota._forget_parent_calls()  # what os.register_at_fork runs in a child
    assert quota.snapshot(0.0).waiting == 0
    assert quota.reserve((1, 2), 100, 0.0, FAR).seconds <= 0.5  # first in line now
