"""The concurrency limit inside the call: waiting for a slot, requeueing sheds, streams."""

from __future__ import annotations

import threading

import httpx
import pytest
import respx

import stormguard
from stormguard import ConcurrencyLimiter, RetryBudget
from stormguard._policies.breaker.states import CircuitState
from stormguard._policies.limiter.lease import Lease
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

ENDPOINT = "llm.test:80"
A, B = "http://a.test/v1", "http://b.test/v1"
FAR = 1e9


def hold(limiter: ConcurrencyLimiter, endpoint: str = ENDPOINT, n: int = 1) -> list[Lease]:
    """Take ``n`` slots of ``endpoint`` as other calls would."""
    leases = []
    for i in range(n):
        got = limiter.endpoint(endpoint).acquire(1, -1 - i, FAR)
        assert isinstance(got, Lease)
        leases.append(got)
    return leases


def shed(**headers: str) -> httpx.Response:
    return httpx.Response(
        503,
        json={"error": {"message": "busy"}},
        headers={"x-load-shed": "queue_full", "x-should-retry": "true", **headers},
    )


async def test_a_call_over_the_limit_waits_for_a_slot_then_goes(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json())
    limiter = ConcurrencyLimiter(initial_limit=1, max_limit=1)  # real time: the wait is real
    client = api.client(concurrency=limiter)
    [other] = hold(limiter)
    timer = threading.Timer(0.2, other.release)
    timer.start()
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    timer.join()
    [attempt] = resp.attempt_history
    assert attempt.queued >= 0.1 and attempt.concurrency_limit == 1
    [state] = client.stats().concurrency
    assert (state.endpoint, state.in_flight, state.waiting) == (ENDPOINT, 0, 0)


async def test_no_slot_before_the_deadline_is_a_typed_timeout_with_no_attempt(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    limiter = ConcurrencyLimiter(initial_limit=1, max_limit=1)
    client = api.client(concurrency=limiter)
    hold(limiter)
    with pytest.raises(stormguard.QueueTimeoutError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES, timeout=0.05))
    err = info.value
    assert isinstance(err, stormguard.APITimeoutError)
    assert (err.retry_stopped_by, err.attempts, err.attempt_history) == ("deadline", 0, ())
    assert err.queued_s >= 0.04
    assert route.call_count == 0
    assert client.stats().concurrency[0].refused == 1


async def test_a_full_local_queue_refuses_at_once(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json())
    limiter = ConcurrencyLimiter(initial_limit=1, max_waiting=0, clock=api.clock)
    client = api.client(concurrency=limiter)
    hold(limiter)
    with pytest.raises(stormguard.LocalQueueFullError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.retry_stopped_by == "queue_full" and info.value.attempts == 0


async def test_a_shed_is_requeued_with_its_attempt_number_and_never_opens_the_breaker(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[shed(**{"retry-after": "2"})] * 12 + [httpx.Response(200, json=chat_json())]
    )
    limiter = ConcurrencyLimiter(
        clock=api.clock, requeue_budget=RetryBudget(ratio=1.0, min_retries_per_second=10)
    )
    client = api.client(concurrency=limiter, retry_policy=stormguard.RetryPolicy(max_attempts=1))
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.choices[0].message.content == "hello"
    sent = [c.request.headers for c in route.calls]
    assert {h["x-stormguard-attempt"] for h in sent} == {"1"}  # never a retry: never processed
    assert [h.get("x-stormguard-requeue") for h in sent[:3]] == [None, "1", "2"]
    history = resp.attempt_history
    assert [a.outcome for a in history] == ["requeued"] * 12 + ["ok"]
    # Alone on the endpoint, the shed came from load this client does not make: the
    # server's Retry-After is honoured before each requeue.
    assert api.clock.sleeps == [2.0] * 12
    stats = client.stats()
    assert (stats.attempts, stats.retries, stats.requeues) == (13, 0, 12)
    [breaker] = stats.breakers
    assert breaker.state is CircuitState.CLOSED  # "alive, but full" is not a failure
    assert stats.concurrency[0].limit < 20  # each shed lowered the limit instead


async def test_a_requeue_the_budget_refuses_becomes_an_ordinary_retry(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[shed(), shed(), httpx.Response(200, json=chat_json())]
    )
    empty = RetryBudget(ratio=0.0, min_retries_per_second=0.0)
    client = api.client(concurrency=ConcurrencyLimiter(clock=api.clock, requeue_budget=empty))
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.outcome for a in resp.attempt_history] == ["retry", "retry", "ok"]
    assert [c.request.headers["x-stormguard-attempt"] for c in route.calls] == ["1", "2", "3"]
    stats = client.stats()
    assert (stats.retries, stats.requeues, stats.requeues_refused_by_budget) == (2, 0, 2)


async def test_should_retry_false_is_never_requeued(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(
        503, json={}, headers={"x-load-shed": "retry_shed", "x-should-retry": "false"}
    )
    client = api.client()
    with pytest.raises(stormguard.ServiceUnavailableError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.retry_stopped_by == "should_retry_false" and route.call_count == 1


async def test_an_sse_shed_before_the_first_chunk_is_requeued(
    api: Api, mock: respx.MockRouter
) -> None:
    vllm_shed = sse('{"error": {"message": "busy", "code": 503}}', done=False)
    mock.post("/chat/completions").mock(
        side_effect=[event_stream(vllm_shed), event_stream(sse(chunk("a"), chunk("b")))]
    )
    client = api.client()
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    chunks = await api.collect(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["a", "b"]
    assert [a.outcome for a in stream.attempt_history] == ["requeued", "ok"]
    assert client.stats().requeues == 1


async def test_a_stream_holds_its_slot_until_it_is_closed(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        side_effect=lambda request: event_stream(sse(chunk("a"), chunk("b")))
    )
    limiter = ConcurrencyLimiter(initial_limit=1, max_limit=1, clock=api.clock)
    client = api.client(concurrency=limiter)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    state = limiter.state()[0]
    assert state.in_flight == 1  # past the first chunk, the server still generates
    await api.collect(stream)
    assert limiter.state()[0].in_flight == 0  # [DONE]: the slot is free
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert limiter.state()[0].in_flight == 1
    await api.run(stream.close() if api.mode == "sync" else stream.aclose())
    assert limiter.state()[0].in_flight == 0  # closed early: free too


async def test_the_endpoint_with_a_free_slot_is_chosen(api: Api) -> None:
    limiter = ConcurrencyLimiter(initial_limit=2, max_limit=2, clock=api.clock)
    with respx.mock(assert_all_called=False) as mock:
        a = mock.post(f"{A}/chat/completions").respond(200, json=chat_json())
        b = mock.post(f"{B}/chat/completions").respond(200, json=chat_json())
        client = api.client(base_url=[A, B], concurrency=limiter)
        held = hold(limiter, "a.test:80", n=2)
        for _ in range(10):
            await api.run(client.chat.completions.create(messages=MESSAGES))
        for lease in held:
            lease.release()
    assert (a.call_count, b.call_count) == (0, 10)


async def test_clients_given_one_limiter_share_it(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json())
    limiter = ConcurrencyLimiter(clock=api.clock)
    first, second = api.client(concurrency=limiter), api.client(concurrency=limiter)
    assert first.concurrency is second.concurrency is limiter
    hold(limiter, n=3)
    assert first.stats().concurrency == second.stats().concurrency
    assert first.stats().concurrency[0].in_flight == 3


def test_a_concurrency_that_is_not_a_limiter_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="ConcurrencyLimiter"):
        stormguard.Client(base_url="http://x.test/v1", concurrency=5)  # type: ignore[arg-type]
    assert stormguard.Client(base_url="http://x.test/v1", concurrency=None).concurrency is None


async def test_an_endpoint_whose_breaker_opened_ramps_back_from_the_bottom(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(502, json={})
    limiter = ConcurrencyLimiter(clock=api.clock)
    breaker = stormguard.BreakerConfig(consecutive_failures=2, open_time=5.0, jitter=0.0)
    client = api.client(
        concurrency=limiter, breaker=breaker, retry_policy=stormguard.RetryPolicy(max_attempts=1)
    )
    for _ in range(2):
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    state = limiter.state()[0]
    assert (state.limit, state.slow_start) == (1, True)  # from 20: it will ramp, not jump
    api.clock.advance(5.0)
    route.respond(200, json=chat_json())
    await api.run(client.chat.completions.create(messages=MESSAGES))  # the probe
    assert limiter.state()[0].limit == 2  # one step at a time


async def test_a_stream_the_server_cuts_after_its_first_chunk_is_a_drop(
    api: Api, mock: respx.MockRouter
) -> None:
    cut = sse(chunk("a"), chunk("b"), done=False)  # a crash cut it: no [DONE]
    mock.post("/chat/completions").mock(side_effect=lambda request: event_stream(cut))
    limiter = ConcurrencyLimiter(initial_limit=4, clock=api.clock)
    client = api.client(concurrency=limiter)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.StreamInterruptedError):
        await api.collect(stream)
    state = limiter.state()[0]
    # Its success at the first chunk does not count (that would make it 5): the server
    # lost work it had taken, as an engine out of memory does, and the limit comes down.
    assert (state.limit, state.in_flight, state.decreases) == (3, 0, 1)


async def test_a_stream_the_caller_closes_early_leaves_the_limit_alone(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=lambda request: event_stream(sse(chunk("a"), chunk("b")))
    )
    limiter = ConcurrencyLimiter(initial_limit=4, clock=api.clock)
    client = api.client(concurrency=limiter)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    await api.run(stream.close() if api.mode == "sync" else stream.aclose())
    state = limiter.state()[0]
    assert (state.limit, state.in_flight, state.decreases) == (4, 0, 0)


class _Chunks(httpx.SyncByteStream):
    """A body that arrives chunk by chunk, and may be cut after the last."""

    def __init__(self, *chunks: bytes, cut: bool = False) -> None:
        self._chunks, self._cut = chunks, cut

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self._chunks
        if self._cut:
            raise httpx.ReadError("connection reset by peer")


@pytest.mark.parametrize(
    "body",
    [
        _Chunks(sse(chunk("a"), done=False), sse('{"error": {"message": "crashed", "code": 503}}')),
        _Chunks(sse(chunk("a"), done=False), sse(chunk("b"), done=False), cut=True),
        _Chunks(sse(chunk("a"), '{"error": {"message": "crashed", "code": 503}}')),
    ],
    ids=["error event later", "connection cut", "error in the first chunk"],
)
def test_openai_on_the_transport_a_stream_the_server_cuts_is_a_drop(body: _Chunks) -> None:
    openai = pytest.importorskip("openai")
    limiter = ConcurrencyLimiter(initial_limit=4)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    http = stormguard.httpx_client(
        base_url="http://llm.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        concurrency=limiter,
    )
    oai = openai.OpenAI(base_url="http://llm.test/v1", api_key="k", http_client=http, max_retries=0)
    with pytest.raises((openai.APIError, httpx.TransportError)):
        list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    state = limiter.state()[0]
    assert (state.limit, state.in_flight, state.decreases) == (3, 0, 1)
