"""Hedged requests through whole async calls on respx and a fake clock: a slow
primary loses to the hedge and is cancelled, a fast one sends no hedge, the
budget and the endpoints bound the hedges, a racer's failure leaves the other
running, the token reservation is charged once, and the records, stats and spans
say what happened. The delay passes at once on the fake clock, so the first
request is always the primary's and the second the hedge's."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard import HedgePolicy
from stormguard._call.hedge_race import Race
from stormguard.telemetry import Telemetry
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy, TokenRateLimiter
from tests.sdk.helpers import MESSAGES, chat_json, chunk, sse, unreachable

URLS = ["http://h0.test/v1", "http://h1.test/v1"]
ANY_HOST = r"http://h[0-9]\.test/v1/chat/completions"
HEDGE = HedgePolicy(delay=0.5, budget=1.0)


class Until:
    """A plan's answer: 200 once ``ready()`` holds (checked at each turn of the loop)."""

    def __init__(self, ready: Any) -> None:
        self.ready = ready

    async def answer(self) -> httpx.Response:
        for _ in range(10_000):
            if self.ready():
                return httpx.Response(200, json=chat_json())
            await asyncio.sleep(0)
        raise AssertionError("never ready")


class Server:
    """Answers requests in arrival order: each one's answer is the next of ``plan``,
    a response, "hang" (waits until cancelled, which it records) or an ``Until``."""

    def __init__(self, *plan: httpx.Response | str | Until) -> None:
        self.plan = list(plan)
        self.hosts: list[str] = []
        self.cancelled: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host.split(".")[0]
        self.hosts.append(host)
        answer = self.plan.pop(0) if self.plan else httpx.Response(200, json=chat_json())
        if isinstance(answer, Until):
            return await answer.answer()
        if answer == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(host)
                raise
        assert isinstance(answer, httpx.Response)
        return answer


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        yield mock


def serve(router: respx.MockRouter, *plan: httpx.Response | str | Until) -> Server:
    server = Server(*plan)
    router.post(url__regex=ANY_HOST).mock(side_effect=server)
    return server


@pytest.fixture
async def clients() -> AsyncIterator[list[stormguard.AsyncClient]]:
    made: list[stormguard.AsyncClient] = []
    yield made
    for client in made:
        await client.close()


@pytest.fixture
def make(clients: list[stormguard.AsyncClient]) -> Any:
    def build(**kwargs: Any) -> stormguard.AsyncClient:
        clock = kwargs.pop("clock", FakeClock())
        kwargs.setdefault("base_url", URLS)
        kwargs.setdefault("hedge", HEDGE)
        client = stormguard.AsyncClient(
            model="m",
            api_key="sk-test",
            clock=clock,
            ejection=stormguard.EjectionConfig(probe=unreachable),
            retry_budget=stormguard.RetryBudget(ratio=1.0, min_retries_per_second=10, clock=clock),
            **kwargs,
        )
        clients.append(client)
        return client

    return build


class Hanging(httpx.AsyncByteStream):
    """A stream body that never sends a byte; records its close."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""  # pragma: no cover

    async def aclose(self) -> None:
        self.closed = True


async def test_a_slow_primary_loses_to_the_hedge_and_is_cancelled(
    router: respx.MockRouter, make: Any
) -> None:
    server = serve(router, "hang", httpx.Response(200, json=chat_json("from the hedge")))
    client = make()
    resp = await client.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "from the hedge"
    primary, hedge = server.hosts
    assert primary != hedge  # another endpoint
    assert server.cancelled == [primary]  # the primary's request was abandoned
    records = resp.attempt_history
    assert [(r.endpoint, r.outcome, r.hedge) for r in records] == [
        (f"{primary}.test:80", "hedge_lost", False),
        (f"{hedge}.test:80", "ok", True),
    ]
    stats = client.stats()
    assert (stats.logical_calls, stats.attempts) == (1, 2)
    assert (stats.hedges_sent, stats.hedges_won) == (1, 1)
    assert (stats.hedges_skipped_budget, stats.hedges_skipped_no_endpoint) == (0, 0)


async def test_a_primary_that_answers_before_the_delay_sends_no_hedge(
    router: respx.MockRouter, make: Any
) -> None:
    server = serve(router)
    # The real clock: the answer comes at once, the delay is 30 s away.
    client = make(clock=stormguard.Clock(), hedge=HedgePolicy(delay=30.0, budget=1.0))
    resp = await client.chat.completions.create(messages=MESSAGES)
    assert len(server.hosts) == 1 and server.cancelled == []
    assert [(r.outcome, r.hedge) for r in resp.attempt_history] == [("ok", False)]
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_won, stats.attempts) == (0, 0, 1)


async def test_the_primary_wins_when_the_hedge_is_slower(
    router: respx.MockRouter, make: Any
) -> None:
    gate = asyncio.Event()

    class Late(Server):
        async def __call__(self, request: httpx.Request) -> httpx.Response:
            if not self.hosts:  # the primary answers once the hedge is sent
                self.hosts.append(request.url.host)
                await gate.wait()
                return httpx.Response(200, json=chat_json("primary"))
            gate.set()
            return await super().__call__(request)

    server = Late("hang")
    router.post(url__regex=ANY_HOST).mock(side_effect=server)
    client = make()
    resp = await client.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "primary"
    assert len(server.cancelled) == 1  # the hedge was abandoned
    assert [(r.outcome, r.hedge) for r in resp.attempt_history] == [
        ("ok", False),
        ("hedge_lost", True),
    ]
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_won) == (1, 0)


async def test_no_hedge_without_a_second_endpoint(router: respx.MockRouter, make: Any) -> None:
    serve(router)
    client = make(base_url=URLS[0])
    # One endpoint: the call is not even raced.
    assert client.chat.completions._client._core.hedge_calls is None
    await client.chat.completions.create(messages=MESSAGES)
    assert client.stats().hedges_skipped_no_endpoint == 0


def skipped(client: stormguard.AsyncClient) -> Until:
    """The primary's answer once the client has counted a hedge not sent."""
    return Until(
        lambda: client.stats().hedges_skipped_budget + client.stats().hedges_skipped_no_endpoint
    )


async def test_no_hedge_to_an_open_circuit(router: respx.MockRouter, make: Any) -> None:
    client = make(base_url=URLS)
    core = client._core
    assert core.breakers is not None
    # One endpoint's breaker is open: the primary goes to the other, and the hedge
    # has nowhere to go.
    breaker = core.breakers.get("h1.test:80", "m")
    for _ in range(100):  # failures until it opens
        if not breaker.accepting:
            break
        breaker.before_call().failure()
    assert not breaker.accepting
    server = serve(router, skipped(client))
    await client.chat.completions.create(messages=MESSAGES)
    assert server.hosts == ["h0"]
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_skipped_no_endpoint) == (0, 1)


async def test_no_hedge_to_a_shedding_endpoint(router: respx.MockRouter, make: Any) -> None:
    client = make()
    core = client._core
    # Whichever endpoint the primary takes, the other says it sheds.
    for state in core.picker.states:
        core.picker.observe(state, stormguard.ServerLoad(queue_depth=3, load_shed="overloaded"))
    server = serve(router, skipped(client))
    await client.chat.completions.create(messages=MESSAGES)
    assert len(server.hosts) == 1
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_skipped_no_endpoint) == (0, 1)


async def test_a_spent_budget_sends_no_hedge(router: respx.MockRouter, make: Any) -> None:
    client = make(hedge=HedgePolicy(delay=0.5, budget=0.05))
    # One call deposits 0.05 of a hedge: not enough for one.
    server = serve(router, skipped(client))
    await client.chat.completions.create(messages=MESSAGES)
    assert len(server.hosts) == 1
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_skipped_budget) == (0, 1)


async def test_a_hedge_the_budget_held_back_goes_at_a_later_delay(
    router: respx.MockRouter, make: Any
) -> None:
    """The budget is spent at the slow call's delay; another call refills it while
    the slow one waits, and its hedge goes at its next delay and wins: the call that
    waits longest is the one that needs a hedge most."""
    client = make(hedge=HedgePolicy(delay=0.5, budget=0.5))  # a call deposits half a hedge
    slow_calls = Server("hang", httpx.Response(200, json=chat_json("hedge")))

    async def answer(request: httpx.Request) -> httpx.Response:
        if b"refill" in request.content:
            return httpx.Response(200, json=chat_json("other"))
        return await slow_calls(request)

    router.post(url__regex=ANY_HOST).mock(side_effect=answer)
    slow = asyncio.ensure_future(client.chat.completions.create(messages=MESSAGES))
    for _ in range(10_000):  # until its hedge was held back
        if client.stats().hedges_skipped_budget:
            break
        await asyncio.sleep(0)
    assert client.stats().hedges_skipped_budget == 1
    assert not slow.done()
    refill = [{"role": "user", "content": "refill"}]
    other = await client.chat.completions.create(messages=refill)  # the other half
    assert other.choices[0].message.content == "other"
    resp = await slow
    assert resp.choices[0].message.content == "hedge"
    assert slow_calls.cancelled == [slow_calls.hosts[0]]  # the primary, which lost
    assert sorted((r.hedge, r.outcome) for r in resp.attempt_history) == [
        (False, "hedge_lost"),
        (True, "ok"),
    ]
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_won, stats.hedges_skipped_budget) == (1, 1, 1)


async def test_a_held_back_hedge_is_not_asked_for_after_the_primary_answers(
    router: respx.MockRouter, make: Any
) -> None:
    client = make(hedge=HedgePolicy(delay=0.5, budget=0.05))
    server = serve(router, skipped(client))
    await client.chat.completions.create(messages=MESSAGES)
    await asyncio.sleep(0)
    assert len(server.hosts) == 1
    assert client.stats().hedges_skipped_budget == 1  # counted once a call


async def test_a_held_back_hedge_is_asked_for_at_doubling_waits(
    router: respx.MockRouter, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the delay, then after twice the last wait, at most 1 s: a thousand calls
    held back in an overloaded fleet do not each ask every few milliseconds."""
    clock = FakeClock()
    client = make(clock=clock, hedge=HedgePolicy(delay=0.1, budget=0.05))  # never enough
    asked: list[float] = []
    send_hedge = Race.send_hedge

    def asking(race: Race) -> Any:
        asked.append(clock.now() - race.started)
        return send_hedge(race)

    monkeypatch.setattr(Race, "send_hedge", asking)
    serve(router, Until(lambda: len(asked) >= 8))
    await client.chat.completions.create(messages=MESSAGES)
    assert asked[:8] == pytest.approx([0.1, 0.3, 0.7, 1.5, 2.5, 3.5, 4.5, 5.5])
    assert client.stats().hedges_skipped_budget == 1


async def test_the_hedge_carries_on_when_the_primary_fails(
    router: respx.MockRouter, make: Any
) -> None:
    gate = asyncio.Event()
    client = make()

    class Plan(Server):
        async def __call__(self, request: httpx.Request) -> httpx.Response:
            n = len(self.hosts)
            self.hosts.append(request.url.host)
            if n == 0:  # the primary: fails once the hedge is out, not retryable
                await gate.wait()
                return httpx.Response(400, json={"error": {"message": "bad"}})
            gate.set()
            # The hedge answers once the primary's attempt has ended (its endpoint
            # has nothing in flight).
            primary = next(
                s for s in client._core.picker.states if s.name.startswith(self.hosts[0])
            )
            await Until(lambda: primary.in_flight == 0).answer()
            return httpx.Response(200, json=chat_json("hedge"))

    server = Plan()
    router.post(url__regex=ANY_HOST).mock(side_effect=server)
    resp = await client.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "hedge"
    assert len(server.hosts) == 2
    outcomes = sorted((r.hedge, r.outcome) for r in resp.attempt_history)
    assert outcomes == [(False, "not_retryable"), (True, "ok")]
    assert client.stats().hedges_won == 1


async def test_both_failing_raise_the_primarys_error(router: respx.MockRouter, make: Any) -> None:
    gate = asyncio.Event()

    class Plan(Server):
        async def __call__(self, request: httpx.Request) -> httpx.Response:
            n = len(self.hosts)
            self.hosts.append(request.url.host)
            if n == 0:
                await gate.wait()
                return httpx.Response(400, json={"error": {"message": "primary's"}})
            gate.set()
            return httpx.Response(422, json={"error": {"message": "hedge's"}})

    router.post(url__regex=ANY_HOST).mock(side_effect=Plan())
    client = make()
    with pytest.raises(stormguard.APIStatusError) as info:
        await client.chat.completions.create(messages=MESSAGES)
    assert info.value.status_code == 400
    assert info.value.attempts == 2
    assert sorted((r.hedge, r.status_code) for r in info.value.attempt_history) == [
        (False, 400),
        (True, 422),
    ]


async def test_a_stream_hedge_wins_at_its_first_chunk(router: respx.MockRouter, make: Any) -> None:
    body = Hanging()
    slow = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)
    fast = httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=sse(chunk("he"), chunk("dge")),
    )
    serve(router, slow, fast)
    client = make()
    stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content async for c in stream])
    assert text == "hedge"
    assert body.closed  # the primary's stream, open at its headers, was closed
    assert [(r.outcome, r.hedge) for r in stream.attempt_history] == [
        ("hedge_lost", False),
        ("ok", True),
    ]


async def test_a_stream_race_loser_gives_its_endpoint_a_lower_bound(
    router: respx.MockRouter, make: Any
) -> None:
    """With ``LatencyRouting``, the cancelled loser's first chunk is known to take
    longer than it waited: its endpoint's estimate is at least that, and the next
    stream goes to the winner's endpoint first."""
    body = Hanging()
    slow = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)
    fast = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=sse(chunk("x"))
    )
    serve(router, slow, fast)
    client = make(latency_routing=stormguard.LatencyRouting())
    stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
    assert [c async for c in stream]
    lost, won = stream.attempt_history
    states = {s.name: s for s in client._core.picker.states}
    loser = states[lost.endpoint].first_chunk_latency
    assert loser is not None and loser.value >= HEDGE.delay
    winner = states[won.endpoint].first_chunk_latency
    assert winner is not None and winner.value < loser.value
    ranked = client._core.picker.candidates(latency=client._core.latency_routing, stream=True)
    assert ranked[0].name == won.endpoint
    # Neither attempt still counts as waiting for its first chunk.
    assert all(not s.waiting for s in states.values())


async def test_the_token_reservation_is_charged_once(router: respx.MockRouter, make: Any) -> None:
    serve(router, "hang", httpx.Response(200, json=chat_json()))  # usage: 7 tokens
    clock = FakeClock()
    limiter = TokenRateLimiter(tokens_per_minute=6, burst=1000, clock=clock.now)
    client = stormguard.AsyncClient(
        base_url=URLS,
        model="gpt-4o",
        api_key="sk-test",
        clock=clock,
        hedge=HEDGE,
        ejection=stormguard.EjectionConfig(probe=unreachable),
        token_policy=TokenPolicy(
            rate_limiter=limiter, server_context_windows=False, server_tokenize=False
        ),
    )
    try:
        before = limiter.available
        resp = await client.chat.completions.create(messages=MESSAGES, max_tokens=50)
        assert [r.hedge for r in resp.attempt_history] == [False, True]
        # One call's usage (7 tokens) was taken, not two reservations.
        assert limiter.available == pytest.approx(before - 7, abs=0.5)
    finally:
        await client.close()


async def test_spans_say_which_attempt_was_the_hedge_and_that_it_won(
    router: respx.MockRouter, make: Any
) -> None:
    serve(router, "hang", httpx.Response(200, json=chat_json()))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = make(telemetry=Telemetry(tracer_provider=provider))
    await client.chat.completions.create(messages=MESSAGES)
    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name == "chat m"]
    attempts = [s for s in spans if s.name.startswith("POST")]
    assert len(calls) == 1 and len(attempts) == 2
    assert calls[0].attributes is not None
    assert calls[0].attributes["stormguard.hedge.outcome"] == "won"
    assert calls[0].attributes["stormguard.attempts"] == 2
    assert "stormguard.cancelled" not in calls[0].attributes
    hedged = [dict(a.attributes or {}) for a in attempts]
    assert sorted(a.get("stormguard.hedge", False) for a in hedged) == [False, True]
    lost = next(a for a in hedged if not a.get("stormguard.hedge"))
    assert lost["stormguard.attempt.outcome"] == "cancelled"
    parents = {a.parent.span_id for a in attempts if a.parent is not None}
    assert parents == {calls[0].context.span_id}


async def test_hedge_per_call_and_with_options(router: respx.MockRouter, make: Any) -> None:
    server = serve(router, "hang", httpx.Response(200, json=chat_json()))
    client = make(hedge=None)
    assert client._core.hedge is None
    # Per call: a policy given to one call hedges that call only.
    await client.chat.completions.create(messages=MESSAGES, hedge=HEDGE)
    assert client.stats().hedges_won == 1 and server.cancelled
    # with_options: its calls hedge, and share the client's stats and budget.
    hedged = client.with_options(hedge=HEDGE)
    assert hedged._core.hedge is HEDGE and hedged._core.hedging is client._core.hedging
    # hedge=None per call turns a client's hedging off for that call: not raced.
    await hedged.chat.completions.create(messages=MESSAGES, hedge=None)
    assert len(server.hosts) == 3
    assert client.stats().hedges_sent == 1


def test_a_bad_hedge_option_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"hedge must be a stormguard\.HedgePolicy"):
        stormguard.AsyncClient(base_url=URLS, hedge=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay"):
        HedgePolicy(delay=0)
    with pytest.raises(ValueError, match="budget"):
        HedgePolicy(budget=1.5)


def sync_client(budget: float) -> stormguard.Client:
    """A sync client over both hosts, hedging after 50 ms (real time) within ``budget``."""
    return stormguard.Client(
        base_url=URLS,
        model="m",
        api_key="k",
        hedge=HedgePolicy(delay=0.05, budget=budget),
        ejection=stormguard.EjectionConfig(probe=unreachable),
    )


def test_a_sync_hedge_wins_over_a_primary_that_fails() -> None:
    # Sync: the primary fails (not retryable) once the hedge is out; the hedge answers.
    hedge_out = threading.Event()
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if len(seen) == 1:
            assert hedge_out.wait(10)
            return httpx.Response(400, json={"error": {"message": "bad"}})
        hedge_out.set()
        return httpx.Response(200, json=chat_json("hedge"))

    with respx.mock(assert_all_called=False) as router:
        router.post(url__regex=ANY_HOST).mock(side_effect=answer)
        with sync_client(budget=1.0) as client:
            resp = client.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "hedge"
    assert seen[0] != seen[1]
    assert client.stats().hedges_won == 1
    assert sorted((r.hedge, r.outcome) for r in resp.attempt_history)[-1] == (True, "ok")


def test_a_sync_hedge_the_budget_held_back_goes_at_a_later_delay() -> None:
    held_back, hedged = threading.Event(), threading.Event()
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if b"refill" in request.content:
            return httpx.Response(200, json=chat_json("other"))
        seen.append(request.url.host)
        if len(seen) == 1:  # the slow call's primary: answers once its hedge is out
            assert hedged.wait(10)
            return httpx.Response(200, json=chat_json("primary"))
        hedged.set()
        return httpx.Response(200, json=chat_json("hedge"))

    with respx.mock(assert_all_called=False) as router:
        router.post(url__regex=ANY_HOST).mock(side_effect=answer)
        with sync_client(budget=0.5) as client:
            got: list[Any] = []
            slow = threading.Thread(
                target=lambda: got.append(client.chat.completions.create(messages=MESSAGES))
            )
            slow.start()
            for _ in range(1000):  # until its hedge was held back
                if client.stats().hedges_skipped_budget:
                    held_back.set()
                    break
                threading.Event().wait(0.01)
            assert held_back.is_set()
            refill = [{"role": "user", "content": "refill"}]
            other = client.chat.completions.create(messages=refill)  # the other half
            slow.join(10)
            assert not slow.is_alive()
    assert other.choices[0].message.content == "other"
    (resp,) = got
    assert resp.choices[0].message.content == "hedge"
    assert seen[0] != seen[1]
    stats = client.stats()
    assert (stats.hedges_sent, stats.hedges_won, stats.hedges_skipped_budget) == (1, 1, 1)


async def test_the_transport_hedges_openai_pythons_calls(router: respx.MockRouter) -> None:
    server = serve(router, "hang", httpx.Response(200, json=chat_json("hedged")))
    openai = pytest.importorskip("openai")
    client = stormguard.AsyncOpenAI(
        base_url=URLS, api_key="sk-test", hedge=HEDGE, clock=FakeClock()
    )
    try:
        resp = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    finally:
        await client.close()
    assert resp.choices[0].message.content == "hedged"
    assert len(server.cancelled) == 1
    assert isinstance(resp, openai.types.chat.ChatCompletion)


async def test_the_learned_delay_hedges_only_once_enough_latencies_are_known(
    router: respx.MockRouter, make: Any
) -> None:
    client = make(hedge=HedgePolicy(min_samples=3, window=10, budget=1.0))
    server = serve(
        router,
        *(httpx.Response(200, json=chat_json()) for _ in range(3)),
        "hang",
        httpx.Response(200, json=chat_json("hedge")),
    )
    for _ in range(3):  # too few latencies known: not raced, each one timed
        await client.chat.completions.create(messages=MESSAGES)
    assert client._core.hedging.delay_for("m", client._core.hedge) == 0.0  # the fake clock's
    assert (len(server.hosts), client.stats().hedges_sent) == (3, 0)
    resp = await client.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "hedge"
    assert client.stats().hedges_won == 1


@pytest.mark.parametrize("ending", ["hedge wins", "both fail"])
async def test_a_hedged_call_leaves_no_cycle(
    router: respx.MockRouter, make: Any, ending: str
) -> None:
    from tests.sdk.call.test_call_garbage import calls_the_collector_freed

    client = make()
    failing = httpx.Response(400, json={"error": {"message": "no"}})

    async def one() -> None:
        if ending == "hedge wins":
            serve(router, "hang", httpx.Response(200, json=chat_json()))
            await client.chat.completions.create(messages=MESSAGES)
        else:
            serve(router, Until(lambda: True), failing)
            router.routes.clear()
            router.post(url__regex=ANY_HOST).mock(return_value=failing)
            with pytest.raises(stormguard.APIStatusError):
                await client.chat.completions.create(messages=MESSAGES)

    assert await calls_the_collector_freed(one) == []
