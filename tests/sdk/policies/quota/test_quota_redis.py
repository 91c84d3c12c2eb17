"""The quota shared in Redis (``QuotaPolicy(redis_url=...)``): the bucket script on
fakeredis's Lua (lupa), on a clock the test moves (Redis's ``TIME`` reads the test's
``FakeClock``); the calls of two "processes" (two registries on one Redis) pacing each
other; and Redis down, slow or answering garbage: calls pace locally, one WARNING.
tests/e2e/test_quota_redis.py runs real processes against a real redis-server."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import fakeredis
import httpx
import pytest
import respx
from fakeredis.commands_mixins import server_mixin
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stormguard
from stormguard._core.rate_limit_headers import NO_RATE_LIMIT
from stormguard._policies.limiter.aimd import MAX_PAUSE_S
from stormguard._policies.quota import REDIS_ENV, CallQuota, Pace, QuotaGate, QuotaKey, SharedAsk
from stormguard._policies.quota._bucket import TTL_S, ReplyError, bucket_name, parse_reply
from stormguard._policies.quota._redis import BUCKET_SCRIPT, RedisStore, where
from stormguard.testing import FakeClock
from tests.sdk.helpers import MESSAGES, Api, chat_json
from tests.sdk.policies.quota.quota_shared_sim import run_shared
from tests.sdk.policies.routing.test_providers import ANY, Providers, chat, client_of

#: Redis's clock is the test's FakeClock, from this epoch.
EPOCH = 1_750_000_000.0
PASSWORD = "hunter2-secret"
URL = f"redis://:{PASSWORD}@127.0.0.1:6390/0"
RATE_600 = {
    "error": {
        "message": "Rate limit reached for m in organization org-x on tokens per min (TPM):"
        " Limit 600, Used 600, Requested 40. Please try again in 1s. Visit",
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}


@pytest.fixture
def redis_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A FakeClock that fakeredis's ``TIME`` reads too."""
    clock = FakeClock()
    monkeypatch.setattr(server_mixin, "time", SimpleNamespace(time=lambda: EPOCH + clock.now()))
    return clock


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> fakeredis.FakeServer:
    """One fakeredis server that every ``RedisStore`` of the test talks to."""
    fake = fakeredis.FakeServer()

    def make_sync(self: RedisStore) -> Any:
        self._sync = fakeredis.FakeRedis(server=fake)
        return self._sync

    clients: dict[int, Any] = {}

    def async_client(self: RedisStore, loop: object) -> Any:
        return clients.setdefault(id(loop), fakeredis.FakeAsyncRedis(server=fake))

    monkeypatch.setattr(RedisStore, "_make_sync", make_sync)
    monkeypatch.setattr(RedisStore, "_async_client", async_client)
    return fake


def run(redis: Any, *args: object, key: str = "k") -> Any:
    return parse_reply(redis.eval(BUCKET_SCRIPT, 1, key, *args))


def reserve(
    redis: Any,
    cost: float,
    *,
    room: float = 120.0,
    limit: float = 0.0,
    new: bool = False,
    anchor: str = "",
    refund: float = 0.0,
    pause: float = 0.0,
    waited: float = 0.0,
) -> Any:
    tokens = (repr(limit), "1" if new else "0", anchor, repr(refund))
    requests = ("0", "0", "", "0")
    pacing = (repr(MAX_PAUSE_S), repr(MAX_PAUSE_S - waited), str(TTL_S), repr(pause))
    return run(redis, repr(cost), repr(room), *pacing, *tokens, *requests)


# -- the script ----------------------------------------------------------------------


def test_a_bucket_starts_full_at_its_limit_and_serves_calls_in_turn(
    redis_clock: FakeClock,
) -> None:
    redis = fakeredis.FakeRedis()
    first = reserve(redis, 100)
    assert first.granted and first.wait == 0 and not first.known  # no limit: nothing paced
    # 6,000 tokens a minute (100 a second); calls of 2,000 taken ahead in turn.
    waits = [reserve(redis, 2000, limit=6000).wait for _ in range(5)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] == pytest.approx(20.0) and waits[4] == pytest.approx(40.0)
    redis_clock.advance(40.0)  # the turns came: the bucket is empty, not negative
    after = reserve(redis, 100, limit=6000)
    assert after.wait == pytest.approx(1.0) and after.level_tokens == pytest.approx(-100.0)
    assert redis.ttl("k") == TTL_S


def test_a_turn_past_the_deadline_takes_nothing(redis_clock: FakeClock) -> None:
    redis = fakeredis.FakeRedis()
    reserve(redis, 6000, limit=6000)
    refused = reserve(redis, 500, limit=6000, room=4.0)
    assert not refused.granted and refused.wait == pytest.approx(5.0)
    assert refused.level_tokens == pytest.approx(0.0)
    assert reserve(redis, 500, limit=6000, room=5.0).granted


def test_no_turn_waits_past_the_most_a_call_is_held(redis_clock: FakeClock) -> None:
    redis = fakeredis.FakeRedis()
    for _ in range(5):
        reply = reserve(redis, 6000, limit=6000, room=1000.0, waited=10.0)
        assert reply.granted and reply.wait <= MAX_PAUSE_S - 10.0
    # The debt is bounded too: a minute of refill below empty, not five.
    assert reply.level_tokens >= -6000.0 - 1e-6


def test_the_provider_s_remaining_lowers_the_bucket_and_never_raises_it(
    redis_clock: FakeClock,
) -> None:
    redis = fakeredis.FakeRedis()
    sent = reserve(redis, 1000, limit=6000)  # the bucket: 5,000 left
    reserve(redis, 1000, limit=6000)  # another process's: 4,000 left
    redis_clock.advance(2.0)  # + 200 refilled: 4,200
    # The provider said 1,000 were left when the first was admitted: 1,000 + 200.
    folded = reserve(redis, 0, limit=6000, anchor=repr(1000 - 100.0 * sent.now))
    assert folded.level_tokens == pytest.approx(1200.0, abs=1e-3)
    # A remaining above what the bucket holds changes nothing.
    high = repr(5900 - 100.0 * sent.now)
    assert reserve(redis, 0, limit=6000, anchor=high).level_tokens == pytest.approx(1200.0, abs=1)


def test_a_refund_goes_back_to_the_bucket_never_past_its_limit(redis_clock: FakeClock) -> None:
    redis = fakeredis.FakeRedis()
    reserve(redis, 3000, limit=6000)
    back = reserve(redis, 0, limit=6000, refund=3000)
    assert back.level_tokens == pytest.approx(6000.0)
    assert reserve(redis, 0, limit=6000, refund=5000).level_tokens == pytest.approx(6000.0)


def test_a_429_s_pause_holds_every_call_and_is_bounded(redis_clock: FakeClock) -> None:
    redis = fakeredis.FakeRedis()
    paused = reserve(redis, 10, limit=6000, pause=2.5)
    assert paused.wait == pytest.approx(2.5) and paused.paused_for == pytest.approx(2.5)
    assert reserve(redis, 10, limit=6000).wait == pytest.approx(2.5)  # another process's call
    assert reserve(redis, 10, limit=6000, pause=1e9).wait == pytest.approx(MAX_PAUSE_S)
    redis.hset("k", "nb", "1e300")  # whatever the hash says, no pause past the bound
    assert reserve(redis, 10, limit=6000).wait <= MAX_PAUSE_S


def test_a_new_limit_replaces_the_shared_one_and_an_old_one_does_not(
    redis_clock: FakeClock,
) -> None:
    redis = fakeredis.FakeRedis()
    reserve(redis, 10, limit=6000, new=True)
    assert reserve(redis, 10, limit=3000, new=True).limit_tokens == 3000
    assert reserve(redis, 10, limit=6000).limit_tokens == 3000  # known before: not news
    redis.flushall()  # gone (flushed, expired): made again from what a process knows
    again = reserve(redis, 10, limit=6000)
    assert again.limit_tokens == 6000 and again.level_tokens == pytest.approx(5990.0)


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-inf", "1e309", "0x10", " 5 "]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fields=st.dictionaries(
        st.sampled_from(["tL", "tV", "tT", "tS", "rL", "rV", "rT", "rS", "nb"]), values
    ),
    args=st.lists(values, min_size=14, max_size=14),
    kind=st.sampled_from(["hash", "string", "list", "none"]),
)
def test_whatever_redis_holds_or_is_sent_the_script_answers_a_bounded_reply(
    redis_clock: FakeClock, fields: dict[str, str], args: list[str], kind: str
) -> None:
    redis = fakeredis.FakeRedis()
    if kind == "hash" and fields:
        redis.hset("k", mapping=fields)
    elif kind == "string":
        redis.set("k", "not ours")
    elif kind == "list":
        redis.rpush("k", "a", "b")
    reply = run(redis, *args)  # raises ReplyError if the reply is not the script's
    assert 0 <= reply.wait <= MAX_PAUSE_S and 0 <= reply.paused_for <= MAX_PAUSE_S
    assert redis.type("k") == b"hash" and 0 < redis.ttl("k") <= 10**9


@settings(max_examples=100, deadline=None)
@given(
    raw=st.one_of(
        st.none(),
        st.binary(max_size=20),
        st.integers(),
        st.lists(st.one_of(st.binary(max_size=8), st.integers(), st.none(), st.floats())),
    )
)
def test_a_reply_of_another_shape_is_a_reply_error_never_another_exception(raw: object) -> None:
    with contextlib.suppress(ReplyError):
        parse_reply(raw)


def test_the_redis_name_of_a_key_holds_its_fingerprint_never_the_key() -> None:
    key = QuotaKey("322ad2605eaf", "api.openai.com", "gpt-4o" * 1000)
    name = bucket_name(key)
    assert name.startswith("stormguard:quota:322ad2605eaf:") and len(name) < 64
    assert bucket_name(QuotaKey("322ad2605eaf", "api.openai.com", "gpt-4o-mini")) != name
    assert where(URL) == "127.0.0.1:6390"
    assert where("unix:///run/redis.sock") == "unix:/run/redis.sock"


def test_a_script_the_server_lost_is_sent_again(redis_clock: FakeClock, server: Any) -> None:
    store = RedisStore(URL, 0.1)
    args = (repr(10.0), "5", "60", "60", "300", "0", "600", "1", "", "0", "0", "0", "", "0")
    assert store.run_sync("k", args).granted  # EVALSHA: not cached, so EVAL
    store._sync.script_flush()
    second = store.run_sync("k", args)
    assert not isinstance(second, BaseException) and second.level_tokens == pytest.approx(580)


# -- calls of two processes on one Redis ---------------------------------------------


def policy(**changes: Any) -> stormguard.QuotaPolicy:
    return stormguard.QuotaPolicy(redis_url=URL, **changes)


@pytest.fixture
def shared_api(api: Api, monkeypatch: pytest.MonkeyPatch) -> Api:
    monkeypatch.setattr(server_mixin, "time", SimpleNamespace(time=lambda: EPOCH + api.clock.now()))
    return api


def ok(usage: dict[str, int] | None = None) -> httpx.Response:
    """A chat answer; with ``usage``, the provider's counts (the prompt's trues up what
    the shared bucket took for the call)."""
    return httpx.Response(200, json=chat_json(usage=usage))


async def test_a_process_that_met_a_429_paces_the_others_through_redis(
    shared_api: Api, mock: respx.MockRouter, server: Any
) -> None:
    api = shared_api
    route = mock.post("/chat/completions").mock(
        side_effect=[httpx.Response(429, json=RATE_600, headers={"retry-after": "1"})]
        + [ok() for _ in range(10)]
    )
    # Two registries on one Redis and clock: two processes, as far as pacing goes.
    first = api.client(quota=policy())
    other = api.client(quota=policy(max_keys=1000))
    result = await api.run(first.chat.completions.create(messages=MESSAGES, max_tokens=10))
    assert [a.outcome for a in result.attempt_history] == ["paced", "ok"]
    # The 429 said the key (600 tokens a minute: 10 a second) was spent: the paced
    # attempt waited for its ~28 tokens (the body's bytes / 4, and 10), and told Redis.
    assert result.attempt_history[1].quota_wait >= 2.0
    started = api.clock.now()
    later = await api.run(other.chat.completions.create(messages=MESSAGES, max_tokens=10))
    # The other process never met a 429, and waits its turn in the same bucket.
    assert later.attempts == 1 and later.attempt_history[0].quota_wait >= 2.0
    assert api.clock.now() - started >= 2.0 and route.call_count == 3
    (snapshot,) = other.stats().quota
    assert snapshot.backend == "redis" and snapshot.limit_tokens == 600


async def test_every_attempt_asks_redis_even_before_any_limit_is_known(
    shared_api: Api, mock: respx.MockRouter, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that has seen no signal may be one of many starting a burst: another
    # may learn the limit at any moment.
    api = shared_api
    mock.post("/chat/completions").mock(side_effect=lambda request: ok())
    asked = count_asks(monkeypatch)
    client = api.client(quota=policy())
    for _ in range(5):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert asked == [5] and api.clock.now() == 0.0  # nothing paced, nothing waited
    (snapshot,) = client.stats().quota
    assert snapshot.backend == "redis" and snapshot.mode == "off"


def count_asks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked = [0]
    sync, run_async = RedisStore.run_sync, RedisStore.run_async

    def counting_sync(self: RedisStore, *args: Any) -> Any:
        asked[0] += 1
        return sync(self, *args)

    async def counting_async(self: RedisStore, *args: Any) -> Any:
        asked[0] += 1
        return await run_async(self, *args)

    monkeypatch.setattr(RedisStore, "run_sync", counting_sync)
    monkeypatch.setattr(RedisStore, "run_async", counting_async)
    return asked


# -- what goes back to the bucket ----------------------------------------------------

KEY = QuotaKey("k", "h", "m")


def rate_600(used: int) -> str:
    """The provider's 429 for a key of 600 tokens a minute (10 a second)."""
    return (
        "Rate limit reached for m in organization org-x on tokens per min (TPM): Limit 600,"
        f" Used {used}, Requested 40. Please try again in 1s."
    )


def process(clock: FakeClock, i: int) -> QuotaGate:
    """A process's quota: its own registry (one per policy), on the shared Redis."""
    gate = QuotaGate(policy(max_keys=1024 - i), clock)
    gate.registry.activate(KEY)
    return gate


def take(quota: CallQuota, clock: FakeClock, cost: float = 28.0) -> float:
    """One attempt's reservation: the seconds until its turn (0: go now)."""
    pace: Pace | SharedAsk | None = quota.pace(cost, clock.now(), clock.now() + 100)
    while isinstance(pace, SharedAsk):
        pace = quota.answered(pace, pace.ask_sync(), clock.now())
    assert pace is None or pace.granted
    quota.sent()
    return 0.0 if pace is None else pace.seconds


def test_a_call_reserved_before_any_limit_was_known_gives_nothing_back(
    redis_clock: FakeClock, server: Any
) -> None:
    one, two = process(redis_clock, 0), process(redis_clock, 1)
    early = [one.call(KEY, 1), two.call(KEY, 1)]
    assert [take(q, redis_clock) for q in early] == [0.0, 0.0]  # nothing known: go
    # The provider refuses both: its bucket was spent. The first 429 teaches the limit
    # (600 a minute, nothing left), and its call's next reservation waits its turn.
    early[0].refused(0.0, 0.0, rate_600(600), 1.0, NO_RATE_LIMIT)
    first = take(early[0], redis_clock)
    assert first == pytest.approx(2.8, abs=0.01)  # 28 tokens at 10 a second
    # The other 429 comes after. Its call took nothing from the bucket (there was no
    # limit to take from): giving its cost back would seat its retry on the same turn.
    early[1].refused(0.0, 0.0, rate_600(600), 1.0, NO_RATE_LIMIT)
    assert take(early[1], redis_clock) == pytest.approx(first + 2.8, abs=0.01)


def test_a_refused_call_gives_back_what_the_provider_had_left_not_its_reservation(
    redis_clock: FakeClock, server: Any
) -> None:
    one = process(redis_clock, 0)
    learner = one.call(KEY, 1)
    take(learner, redis_clock)
    learner.refused(0.0, 0.0, rate_600(600), 1.0, NO_RATE_LIMIT)  # 600 a minute, spent
    a, c = one.call(KEY, 1), one.call(KEY, 1)
    assert take(a, redis_clock) == pytest.approx(2.8, abs=0.01)
    assert take(c, redis_clock) == pytest.approx(5.6, abs=0.01)
    redis_clock.advance(2.8)
    # At its turn the provider had 10 tokens for a's 28 (another client, a cost
    # underestimated): the bucket counted 18 too many. 10 go back, not 28: c's turn
    # still comes, and the next call's after it, as the provider will have it.
    a.refused(2.8, 2.8, rate_600(590), 1.0, NO_RATE_LIMIT)
    b = one.call(KEY, 1)
    assert take(b, redis_clock) == pytest.approx((28 + 18) / 10, abs=0.01)


@pytest.mark.parametrize(("charged", "next_turn"), [(18.0, 1.8), (38.0, 3.8)])
def test_what_the_provider_charged_trues_up_the_reservation(
    redis_clock: FakeClock, server: Any, charged: float, next_turn: float
) -> None:
    one = process(redis_clock, 0)
    learner = one.call(KEY, 1)
    take(learner, redis_clock)
    learner.refused(0.0, 0.0, rate_600(600), 1.0, NO_RATE_LIMIT)  # 600 a minute, spent
    a = one.call(KEY, 1)
    assert take(a, redis_clock) == pytest.approx(2.8, abs=0.01)  # 28 estimated
    redis_clock.advance(2.8)
    # Its answer says what the provider charged: 10 fewer tokens go back, 10 more are
    # taken; the next call's turn moves by as much (28 at 10 a second, less or more 1 s).
    a.charged(charged)
    assert take(one.call(KEY, 1), redis_clock) == pytest.approx(next_turn, abs=0.01)


async def test_an_answer_s_counted_prompt_trues_up_the_bucket_at_the_next_reservation(
    shared_api: Api, mock: respx.MockRouter, server: Any
) -> None:
    api = shared_api
    usage = {"prompt_tokens": 60, "completion_tokens": 2, "total_tokens": 62}
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(429, json=RATE_600, headers={"retry-after": "1"}),
            ok(usage),
            ok(),
        ]
    )
    client = api.client(quota=policy())
    first = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    # Its paced attempt reserved the call's estimate, 28.25 (the body's bytes / 4 and
    # 10), and the answer says 70 were charged (60 counted, and 10).
    assert first.attempt_history[1].quota_wait == pytest.approx(2.825, abs=0.01)
    second = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    # The next reservation takes the 41.75 not reserved, then its own cost: 10 and the
    # prompt, estimated 30 after "Requested 40" and moved 30 % of the way to the count
    # of 60 (QuotaGate.calibrate): 49. At 10 tokens a second.
    assert second.attempt_history[0].quota_wait == pytest.approx((41.75 + 49) / 10, abs=0.01)


def spent_then(*answers: httpx.Response) -> list[httpx.Response]:
    """A 429 that teaches the key's limit (600 tokens a minute, spent), its paced retry's
    success, then ``answers``."""
    return [httpx.Response(429, json=RATE_600, headers={"retry-after": "1"}), ok(), *answers]


async def test_an_answer_the_provider_did_not_charge_gives_its_reservation_back(
    shared_api: Api, mock: respx.MockRouter, server: Any
) -> None:
    # A 400 costs nothing (the reference server charges a request once it is valid).
    api = shared_api
    bad = {"error": {"message": "bad", "type": "invalid_request_error"}}
    mock.post("/chat/completions").mock(side_effect=spent_then(httpx.Response(400, json=bad), ok()))
    client = api.client(quota=policy(), max_retries=0)
    first = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    assert first.attempt_history[1].quota_wait > 2.0  # one call's cost at 10 tokens a second
    with pytest.raises(stormguard.BadRequestError):
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    last = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    # The 400 was not charged: its reservation went back, and the next call found it.
    assert last.attempt_history[0].quota_wait == pytest.approx(0.0, abs=1e-6)
    assert client.stats().quota[0].backend == "redis"


async def test_a_shed_keeps_its_reservation_the_quota_charged_it(
    shared_api: Api, mock: respx.MockRouter, server: Any
) -> None:
    # A server's shed comes after its quota charged the request (docs/server.md): the
    # bucket keeps what it took, and the requeued attempt waits a turn of its own.
    api = shared_api
    shed = httpx.Response(
        429,
        json={"error": {"message": "queue full", "type": "overloaded"}},
        headers={"x-load-shed": "queue_full", "retry-after": "0"},
    )
    mock.post("/chat/completions").mock(side_effect=spent_then(shed, ok()))
    client = api.client(quota=policy())
    first = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    turn = first.attempt_history[1].quota_wait
    second = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    shed_at, requeued = second.attempt_history
    assert shed_at.quota_wait >= turn and requeued.outcome == "ok"
    # The requeue waits a turn of its own (one call's cost at 10 tokens a second, less
    # its back-off): given back, the shed's reservation would have let it go at once.
    assert requeued.quota_wait > 1.0


@pytest.mark.parametrize(
    ("processes", "workers", "calls"),
    [(3, 4, 66), (2, 31, 62)],
    ids=["3x4-threads", "62-at-once"],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_once_the_bucket_knows_the_limit_no_call_it_grants_is_refused(
    redis_clock: FakeClock, server: Any, processes: int, workers: int, calls: int, seed: int
) -> None:
    # The reference server's quota without headers (429s only), as in
    # tests/e2e/test_quota_redis.py: every call before the limit is known goes at once;
    # those on their way when the first 429 taught the bucket are the first wave, and
    # may be refused; every call the bucket granted after that finds its room.
    run = run_shared(redis_clock, processes=processes, workers=workers, calls=calls, seed=seed)
    assert run.ok == calls
    assert run.in_flight_when_learned is not None
    assert run.refused_after_learning == 0
    assert run.provider.refused <= run.in_flight_when_learned
    assert run.last <= run.ideal * 1.2 + 1.0


def test_an_overestimated_cost_costs_no_time_once_answers_say_what_was_charged(
    redis_clock: FakeClock, server: Any
) -> None:
    # Each call estimated 226 where the provider charges 215 (a prompt counted heavy):
    # a bucket that kept the estimate ran 5 % under the key's rate (8 s over the least
    # time of 155 s for 200 calls); trued up by each answer, the batch ends within the
    # last answers' over-reservation (12 calls queued x 11 tokens) and one answer's time.
    run = run_shared(redis_clock, calls=200, estimate=226)
    assert run.ok == 200 and run.refused_after_learning == 0
    assert run.last <= run.ideal + 1.0


async def test_redis_down_calls_pace_locally_with_one_warning_then_come_back(
    shared_api: Api,
    mock: respx.MockRouter,
    server: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = shared_api
    mock.post("/chat/completions").mock(side_effect=lambda request: ok())
    client = api.client(quota=policy())
    caplog.set_level(logging.INFO, logger="stormguard")
    await api.run(client.chat.completions.create(messages=MESSAGES))
    server.connected = False
    for _ in range(5):
        result = await api.run(client.chat.completions.create(messages=MESSAGES))
        assert result.attempts == 1
        api.clock.advance(0.6)  # past the recheck: each call would ask Redis
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "127.0.0.1:6390" in warnings[0].getMessage() and PASSWORD not in caplog.text
    assert client.stats().quota[0].backend == "local-fallback"
    server.connected = True
    api.clock.advance(2.0)  # past the first back-off (1 s, jittered to at most 1.2 s)
    await api.run(client.chat.completions.create(messages=MESSAGES))
    assert client.stats().quota[0].backend == "redis"
    assert "answers again" in caplog.text and PASSWORD not in caplog.text


@pytest.mark.parametrize(
    "answer",
    [b"OK", [b"1", b"2"], [b"1"] * 7 + [b"nan"], [b"x"] * 8, [b"2", b"0"] + [b"1"] * 6],
    ids=["status", "short", "nan", "words", "granted-2"],
)
async def test_a_reply_that_is_not_the_script_s_paces_locally(
    shared_api: Api,
    mock: respx.MockRouter,
    server: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    answer: object,
) -> None:
    api = shared_api
    mock.post("/chat/completions").mock(side_effect=lambda request: ok())

    def garbage(*args: Any, **kwargs: Any) -> object:
        return answer

    async def agarbage(*args: Any, **kwargs: Any) -> object:
        return answer

    monkeypatch.setattr(fakeredis.FakeRedis, "evalsha", garbage)
    monkeypatch.setattr(fakeredis.FakeAsyncRedis, "evalsha", agarbage)
    client = api.client(quota=policy())
    for _ in range(3):
        assert (await api.run(client.chat.completions.create(messages=MESSAGES))).attempts == 1
    assert client.stats().quota[0].backend == "local-fallback"
    assert "ReplyError" in caplog.text


async def test_a_call_with_less_time_left_than_a_redis_call_never_asks_it(
    shared_api: Api, mock: respx.MockRouter, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = shared_api
    mock.post("/chat/completions").mock(side_effect=lambda request: ok())
    asked = count_asks(monkeypatch)
    client = api.client(quota=policy(redis_timeout=0.2))
    result = await api.run(client.chat.completions.create(messages=MESSAGES, timeout=0.1))
    assert result.attempts == 1 and asked == [0]


# -- a Redis that never answers: real sockets, redis-py's own timeouts ----------------


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_redis_that_never_answers_holds_a_call_no_longer_than_its_timeout(
    silent_redis: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    quota = stormguard.QuotaPolicy(redis_url=silent_redis, redis_timeout=0.1)
    with respx.mock(base_url="http://test.invalid/v1") as mock:
        mock.post("/chat/completions").mock(side_effect=lambda request: ok())
        kwargs: dict[str, Any] = {"base_url": "http://test.invalid/v1", "api_key": "sk-x"}
        kwargs |= {"model": "m", "quota": quota, "max_retries": 0}
        started = time.monotonic()
        if mode == "sync":
            with stormguard.Client(**kwargs) as client:
                client.chat.completions.create(messages=MESSAGES)
                client.chat.completions.create(messages=MESSAGES)
                stats = client.stats()
        else:
            async with stormguard.AsyncClient(**kwargs) as aclient:
                await aclient.chat.completions.create(messages=MESSAGES)
                await aclient.chat.completions.create(messages=MESSAGES)
                stats = aclient.stats()
        elapsed = time.monotonic() - started
    # The first call waited the timeout once (then Redis is down for a back-off);
    # the second did not ask it at all.
    assert elapsed < 1.5, elapsed
    assert stats.quota[0].backend == "local-fallback"
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


# -- the setting ---------------------------------------------------------------------


def test_the_redis_url_is_checked_and_never_shown() -> None:
    assert PASSWORD not in repr(policy()) and "redis_url" not in repr(policy())
    with pytest.raises(ValueError, match="redis://") as raised:
        stormguard.QuotaPolicy(redis_url=f"http://:{PASSWORD}@host")
    assert PASSWORD not in str(raised.value)
    with pytest.raises(TypeError):
        stormguard.QuotaPolicy(redis_url=b"redis://x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="redis_timeout"):
        stormguard.QuotaPolicy(redis_timeout=60)


def test_the_environment_names_the_redis_a_policy_without_one_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REDIS_ENV, URL)
    client = stormguard.Client(base_url="http://test.invalid/v1", api_key="sk-x", clock=FakeClock())
    assert client._core.quota is not None and client._core.quota.shared
    explicit = stormguard.QuotaPolicy(redis_url="redis://127.0.0.1:1/0")
    gate = stormguard.Client(
        base_url="http://test.invalid/v1", api_key="sk-x", quota=explicit, clock=FakeClock()
    )._core.quota
    assert gate is not None and gate.policy.redis_url == "redis://127.0.0.1:1/0"
    monkeypatch.setenv(REDIS_ENV, "http://nope")
    with pytest.raises(ValueError, match=REDIS_ENV):
        stormguard.Client(base_url="http://test.invalid/v1", api_key="sk-x")
    monkeypatch.setenv(REDIS_ENV, "")
    local = stormguard.Client(base_url="http://test.invalid/v1", api_key="sk-x")._core.quota
    assert local is not None and not isinstance(local.registry.store, RedisStore)


def test_a_redis_url_without_the_redis_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"stormguard\[redis\]"):
        stormguard.Client(base_url="http://test.invalid/v1", api_key="sk-x", quota=policy())


async def test_a_deployment_whose_shared_key_cannot_fit_the_deadline_passes_the_call_on(
    shared_api: Api, server: Any
) -> None:
    """As without Redis: OpenAI's key is paused for 30 s, a call with 10 s left goes
    to Azure's deployment (its own key) instead of failing with QuotaWaitError."""
    api = shared_api
    limited = httpx.Response(
        429,
        headers={"retry-after": "30"},
        json={"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
    )
    providers = Providers(openai=lambda request: limited)
    with respx.mock(assert_all_called=False) as router:
        router.post(url__regex=ANY).mock(side_effect=providers)
        client = client_of(api, timeout=10.0, quota=policy())
        first = await chat(api, client)
        second = await chat(api, client)
    assert [(a.deployment, a.outcome) for a in first.attempt_history] == [
        ("openai", "paced"),
        ("azure", "ok"),
    ]
    assert [a.deployment for a in second.attempt_history] == ["azure"]
    assert providers.hosts() == ["openai", "azure", "azure"]
