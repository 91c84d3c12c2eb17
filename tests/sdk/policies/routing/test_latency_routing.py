"""Latency-aware choice: peak EWMA estimates per endpoint, and the picker's cost."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import httpx
import pytest
import respx

import stormguard
from stormguard import Endpoint, LatencyRouting
from stormguard._call.attempt_record import completion_tokens
from stormguard._policies.routing.peak_ewma import PeakEwma, token_sample
from stormguard._policies.routing.picker import EndpointPicker
from stormguard.testing import FakeClock
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

A, B, C = "http://a.test/v1", "http://b.test/v1", "http://c.test/v1"
ON = LatencyRouting()
TAU = ON.decay


def picker(*endpoints: Endpoint, seed: int = 0) -> tuple[EndpointPicker, FakeClock]:
    clock = FakeClock()
    return EndpointPicker(endpoints, clock=clock, rng=random.Random(seed)), clock


def firsts(pick: EndpointPicker, draws: int = 200, **kwargs: Any) -> Counter[str]:
    return Counter(pick.candidates(latency=ON, **kwargs)[0].name for _ in range(draws))


# -- the estimate ------------------------------------------------------------------


def test_a_peak_replaces_the_estimate_at_once() -> None:
    ewma = PeakEwma(0.2, 0.0)
    ewma.observe(3.0, 0.01, TAU, lower_bound=False)
    assert ewma.estimate(0.01, TAU) == 3.0


def test_a_lower_sample_is_blended_in_by_the_time_since_the_last() -> None:
    ewma = PeakEwma(1.0, 0.0)
    ewma.observe(0.0, 0.1, TAU, lower_bound=False)  # soon after: it barely moves
    assert ewma.value == pytest.approx(math.exp(-0.01))
    ewma = PeakEwma(1.0, 0.0)
    ewma.observe(0.5, TAU, TAU, lower_bound=False)  # one decay later: weight e**-1
    assert ewma.value == pytest.approx(math.exp(-1) + 0.5 * (1 - math.exp(-1)))


def test_read_without_samples_decays_toward_zero_and_changes_nothing() -> None:
    ewma = PeakEwma(2.0, 0.0)
    assert ewma.estimate(TAU, TAU) == pytest.approx(2.0 * math.exp(-1))
    assert ewma.estimate(3 * TAU, TAU) == pytest.approx(2.0 * math.exp(-3))
    assert (ewma.value, ewma.at) == (2.0, 0.0)


def test_a_lower_bound_only_raises() -> None:
    ewma = PeakEwma(2.0, 0.0)
    ewma.observe(1.0, 0.0, TAU, lower_bound=True)  # slower than 1 s: says nothing new
    assert (ewma.value, ewma.at) == (2.0, 0.0)
    ewma.observe(1.0, 3 * TAU, TAU, lower_bound=True)  # the read had decayed below it
    assert ewma.estimate(3 * TAU, TAU) == 1.0
    ewma.observe(5.0, 3 * TAU, TAU, lower_bound=True)
    assert ewma.estimate(3 * TAU, TAU) == 5.0


def test_a_plain_calls_sample_is_per_token_of_at_least_16() -> None:
    assert token_sample(8.0, 400) == 0.02
    assert token_sample(0.8, 1) == token_sample(0.8, 16) == 0.05


def test_completion_tokens_of_usage() -> None:
    assert completion_tokens({"completion_tokens": 40}) == 40
    assert completion_tokens({"output_tokens": 7}) == 7
    for usage in (None, {}, {"completion_tokens": 0}, {"completion_tokens": True}, "x"):
        assert completion_tokens(usage) is None


def test_policy_checks() -> None:
    assert LatencyRouting(decay=2).decay == 2
    for bad in (0, -1.0, math.inf, math.nan, True, "10"):
        with pytest.raises(ValueError, match="decay"):
            LatencyRouting(decay=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LatencyRouting"):
        stormguard.Client(base_url=[A, B], latency_routing=10)  # type: ignore[arg-type]


# -- the picker ----------------------------------------------------------------------


def test_the_slow_endpoint_is_avoided_once_seen() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(a, 2.0, ON, stream=True)
    pick.observe_latency(b, 0.2, ON, stream=True)
    for _ in range(5):
        pick.started(b)  # b has 5 in flight: (5 + 1) * 0.2 is still under (0 + 1) * 2
    assert firsts(pick, stream=True) == {"b.test:80": 200}
    for _ in range(5):
        pick.started(b)  # 11 * 0.2 is over 2: a takes the next
    assert firsts(pick, stream=True) == {"a.test:80": 200}
    # Without latency, load alone: a (nothing in flight) every time.
    assert pick.candidates(stream=True)[0] is a


def test_a_decayed_estimate_lets_the_slow_endpoint_be_probed_again() -> None:
    pick, clock = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(a, 2.0, ON, stream=True)
    for _ in range(20):  # b keeps answering fast
        clock.advance(1.0)
        pick.observe_latency(b, 0.2, ON, stream=True)
        assert pick.candidates(latency=ON, stream=True)[0] is b
    # 2 * e**-(t / 10) falls under 0.2 after 10 * ln(10), about 23 s: a gets a probe.
    clock.advance(4.0)
    pick.observe_latency(b, 0.2, ON, stream=True)
    assert pick.candidates(latency=ON, stream=True)[0] is a
    # Its answer places it again: still slow, avoided at once.
    pick.observe_latency(a, 2.0, ON, stream=True)
    assert pick.candidates(latency=ON, stream=True)[0] is b


def test_a_peak_is_avoided_at_once() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(a, 0.2, ON, stream=True)
    pick.observe_latency(b, 0.2, ON, stream=True)
    assert set(firsts(pick, stream=True)) == {"a.test:80", "b.test:80"}
    pick.observe_latency(a, 3.0, ON, stream=True)  # one slow first chunk
    assert firsts(pick, stream=True) == {"b.test:80": 200}


def test_no_sample_keeps_todays_order() -> None:
    endpoints = (Endpoint(A), Endpoint(B, weight=2.0), Endpoint(C))
    plain, _ = picker(*endpoints, seed=3)
    aware, _ = picker(*endpoints, seed=3)
    for pick in (plain, aware):
        pick.started(pick.states[0])
        pick.observe(pick.states[2], stormguard.ServerLoad(queue_depth=2))
    for _ in range(100):
        want = [s.name for s in plain.candidates(stream=True)]
        assert [s.name for s in aware.candidates(latency=ON, stream=True)] == want


def test_a_plain_call_ranks_by_its_own_kind() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(a, 3.0, ON, stream=True)  # slow first chunks
    pick.observe_latency(b, 0.1, ON, stream=True)
    pick.observe_latency(a, 0.01, ON, stream=False)  # but fast tokens
    pick.observe_latency(b, 0.05, ON, stream=False)
    assert firsts(pick, stream=True) == {"b.test:80": 200}
    assert firsts(pick, stream=False) == {"a.test:80": 200}


def test_an_endpoint_without_a_sample_ranks_as_the_fastest() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B), Endpoint(C))
    a, b, _ = pick.states
    pick.observe_latency(a, 2.0, ON, stream=True)
    pick.observe_latency(b, 0.2, ON, stream=True)
    pick.started(b)
    # c is new: taken as fast as b (0.2), and with nothing in flight it beats b in
    # every draw of the two, and a (2.0) in every draw.
    drawn = Counter()
    for _ in range(200):
        order = [s.name for s in pick.candidates(latency=ON, stream=True)]
        drawn[order[0]] += 1
        assert order[-1] == "a.test:80"
    assert drawn["c.test:80"] > 100 and drawn["a.test:80"] == 0


def test_weights_divide_the_cost() -> None:
    pick, _ = picker(Endpoint(A, weight=3.0), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(a, 0.2, ON, stream=True)
    pick.observe_latency(b, 0.2, ON, stream=True)
    for _ in range(3):
        pick.started(a)
    pick.started(b)
    # a: (3 + 1) / 3 * 0.2 beats b: (1 + 1) * 0.2; unweighted, b would win.
    assert firsts(pick, stream=True) == {"a.test:80": 200}
    pick.started(a)
    pick.started(a)  # (5 + 1) / 3 = 2: a tie with b, broken by load (b's 1 < a's 5/3)
    assert firsts(pick, stream=True) == {"b.test:80": 200}


def test_equal_estimates_share_the_draws_by_weight() -> None:
    pick, _ = picker(Endpoint(A, weight=3.0), Endpoint(B), Endpoint(C), seed=7)
    for state in pick.states:
        pick.observe_latency(state, 0.5, ON, stream=False)
    drawn = firsts(pick, draws=3000, stream=False)
    assert drawn["a.test:80"] > 1.5 * drawn["b.test:80"]
    assert drawn["a.test:80"] > 1.5 * drawn["c.test:80"]


def test_a_stream_still_waiting_for_its_first_chunk_counts_as_a_sample_of_its_wait() -> None:
    """An endpoint that turned slow stops answering: its estimate decays from its
    last fast answer while the calls sent to it wait. Their wait is what is known:
    the endpoint's estimate is at least the oldest one's, and it is avoided once that
    is over the other's cost, not when the first of them comes back."""
    pick, clock = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(a, 0.1, ON, stream=True)
    pick.observe_latency(b, 0.4, ON, stream=True)  # one slow answer: b's peak
    clock.advance(5.0)  # a: 0.1 * e**-0.5 = 0.06, b: 0.24
    assert firsts(pick, stream=True) == {"a.test:80": 200}
    sent = clock.now()
    key = pick.wait_began(a, sent)
    pick.started(a)
    clock.advance(0.1)  # a: (1 + 1) * 0.1 waited, under b's 0.24
    assert a.latency(True, clock.now(), TAU) == pytest.approx(0.1)
    assert firsts(pick, stream=True) == {"a.test:80": 200}
    pick.wait_began(a, clock.now())  # a second, younger: the oldest is what counts
    pick.started(a)
    clock.advance(0.1)
    assert a.latency(True, clock.now(), TAU) == pytest.approx(0.2)
    assert firsts(pick, stream=True) == {"b.test:80": 200}
    # A plain call's estimate is per token: a stream's wait says nothing of it.
    assert a.latency(False, clock.now(), TAU) is None
    # The oldest gets its first chunk: the younger one's wait (0.1) is the bound now.
    pick.wait_ended(a, key)
    pick.observe_latency(a, clock.now() - sent, ON, stream=True)  # 0.2: a peak
    assert a.latency(True, clock.now(), TAU) == pytest.approx(0.2)
    pick.wait_ended(a, key)  # twice: nothing
    assert a.waiting is not None and len(a.waiting) == 1


def test_a_wait_places_an_endpoint_without_a_sample_yet() -> None:
    pick, clock = picker(Endpoint(A), Endpoint(B))
    a, b = pick.states
    pick.observe_latency(b, 0.5, ON, stream=True)
    pick.wait_began(a, clock.now())
    pick.started(a)
    clock.advance(2.0)  # a's first call has waited 2 s: slower than b's 0.5
    assert a.first_chunk_latency is None
    assert firsts(pick, stream=True) == {"b.test:80": 200}


def test_a_forked_child_forgets_the_parents_waits() -> None:
    pick, clock = picker(Endpoint(A), Endpoint(B))
    a, _ = pick.states
    pick.wait_began(a, clock.now())
    pick._forget_parent_calls()
    assert a.waiting is None
    clock.advance(10.0)
    assert a.latency(True, clock.now(), TAU) is None


def test_bad_samples_are_ignored() -> None:
    pick, _ = picker(Endpoint(A), Endpoint(B))
    a, _ = pick.states
    for bad in (math.nan, math.inf, -1.0):
        pick.observe_latency(a, bad, ON, stream=True)
    assert a.first_chunk_latency is None


# -- calls feed it (sync and async) -------------------------------------------------


def slow_a(api: Api, *, stream: bool, slow: float = 2.0, fast: float = 0.1) -> Any:
    """A handler whose a.test answers ``slow`` seconds after the call (on the fake
    clock), b.test ``fast``; the hosts it served, in order."""
    served: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        served.append(host)
        api.clock.advance(slow if host == "a.test" else fast)
        if stream:
            return event_stream(sse(chunk("hi")))
        return httpx.Response(200, json=chat_json())

    return answer, served


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_calls_feed_the_estimates_and_avoid_the_slow_endpoint(api: Api, stream: bool) -> None:
    answer, served = slow_a(api, stream=stream)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://[ab]\.test/v1/chat/completions").mock(side_effect=answer)
        client = api.client(base_url=[A, B], latency_routing=ON)
        for _ in range(40):
            result = await api.run(client.chat.completions.create(messages=MESSAGES, stream=stream))
            if stream:
                await api.collect(result)
    counts = Counter(served)
    # An endpoint with no estimate goes first among equals: each is tried once, and
    # once a's is known b wins every draw (40 calls are 4 s of fake time: a's estimate
    # decays by e**-0.4 at most).
    assert counts["a.test"] == 1, counts
    a, b = _states(client)
    kind = "first_chunk_latency" if stream else "token_latency"
    estimate_a, estimate_b = getattr(a, kind), getattr(b, kind)
    assert estimate_a is not None and estimate_b is not None
    per = 1 if stream else 16  # chat_json's 2 completion tokens: divided by 16 at least
    assert estimate_b.value == pytest.approx(0.1 / per)
    assert estimate_a.value == pytest.approx(2.0 / per)


async def test_without_it_both_endpoints_share_the_calls(api: Api) -> None:
    answer, served = slow_a(api, stream=False)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://[ab]\.test/v1/chat/completions").mock(side_effect=answer)
        client = api.client(base_url=[A, B])
        for _ in range(40):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert Counter(served)["a.test"] >= 10
    assert all(s.token_latency is None for s in _states(client))


async def test_with_options_turns_it_on(api: Api) -> None:
    answer, served = slow_a(api, stream=False)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://[ab]\.test/v1/chat/completions").mock(side_effect=answer)
        client = api.client(base_url=[A, B])
        aware = client.with_options(latency_routing=ON)
        for _ in range(40):
            await api.run(aware.chat.completions.create(messages=MESSAGES))
    assert Counter(served)["a.test"] == 1


@pytest.mark.parametrize("outcome", ["first chunk", "error", "cancelled"])
async def test_a_streams_wait_is_counted_until_its_first_chunk_or_its_end(
    api: Api, outcome: str
) -> None:
    """The attempt's wait begins when it is sent and ends with its first chunk, or
    with the attempt when it has none (an error, the caller leaving): nothing is
    left behind to make the endpoint look slow."""
    seen: list[tuple[str, int, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        (state,) = [s for s in _states(client) if s.name.startswith(request.url.host)]
        assert state.waiting is not None
        waited = api.clock.now() - next(iter(state.waiting.values()))
        seen.append((request.url.host, len(state.waiting), waited))
        api.clock.advance(0.5)
        if outcome == "error":
            return httpx.Response(400, json={"error": {"message": "bad"}})
        return event_stream(sse(chunk("hi"), chunk(" there")))

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://[ab]\.test/v1/chat/completions").mock(side_effect=answer)
        client = api.client(base_url=[A, B], latency_routing=ON)
        if outcome == "error":
            with pytest.raises(stormguard.BadRequestError):
                await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
        else:
            stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
            assert all(not s.waiting for s in _states(client))  # its first chunk is in
            if outcome == "cancelled":
                await api.run(stream.close())
            else:
                await api.collect(stream)
    ((host, waiting, waited),) = seen
    assert (waiting, waited) == (1, 0.0)
    (served,) = [s for s in _states(client) if s.name.startswith(host)]
    assert served.waiting == {}
    if outcome != "error":  # an error gives no sample (``peak_ewma.py``)
        assert served.first_chunk_latency is not None
        assert served.first_chunk_latency.value == pytest.approx(0.5)


def _states(client: Any) -> list[Any]:
    return list(client._core.picker.states)


async def test_openai_python_over_the_transport_feeds_it(mode: str) -> None:
    """A plain call through ``stormguard.httpx_client`` (its answer parsed only for its
    usage) gives a sample per completion token, as the facade's do."""
    from tests.sdk.transport.test_transport import Oai

    clock_box: list[FakeClock] = []

    def answer(request: httpx.Request) -> httpx.Response:
        clock_box[0].advance(2.0 if request.url.host == "a.test" else 0.1)
        return httpx.Response(200, json=chat_json())

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://[ab]\.test/v1/chat/completions").mock(side_effect=answer)
        oai = Oai(mode, base_url=[A, B], latency_routing=ON)
        oai.client = oai.client.with_options(base_url=A)
        clock_box.append(oai.clock)
        for _ in range(20):
            await oai.chat()
        states = oai.http._transport.client._core.picker.states
    a, b = states
    assert a.token_latency is not None and b.token_latency is not None
    assert a.token_latency.value == pytest.approx(2.0 / 16)  # 2 completion tokens: 16
    assert b.token_latency.value == pytest.approx(0.1 / 16)


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)
