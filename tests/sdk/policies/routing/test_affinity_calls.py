"""Prefix-cache affinity through whole calls, sync and async, on a fake clock: a
call's ``prompt_cache_key`` picks its endpoint by default, ``affinity=None`` turns
it off, a derived key keeps a conversation's turns together, a retry leaves the
home, and the attempt records, stats and spans say what happened."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard import AffinityPolicy, Endpoint, RetryPolicy
from stormguard._policies.routing.affinity import ranking
from stormguard.telemetry import Telemetry
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

HOSTS = ["h0", "h1", "h2"]
URLS = [f"http://{h}.test/v1" for h in HOSTS]
ANY_HOST = r"http://h[0-2]\.test/v1/chat/completions"


class Seen:
    """Answers every host; the hosts asked, in order, are in ``.hosts``."""

    def __init__(self, **answers: httpx.Response) -> None:
        self.hosts: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.answers = answers

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host.split(".")[0]
        self.hosts.append(host)
        self.bodies.append(json.loads(request.content))
        return self.answers.pop(host, None) or httpx.Response(200, json=chat_json())


@pytest.fixture
def seen() -> Iterator[Seen]:
    answer = Seen()
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        yield answer


def home_of(client: Any, key: str) -> str:
    digest = AffinityPolicy().key_of({"prompt_cache_key": key})
    assert digest is not None
    return ranking(digest, client._core.picker.states)[0].name.split(".")[0]


async def test_a_prompt_cache_key_picks_the_endpoint_by_default(api: Api, seen: Seen) -> None:
    client = api.client(base_url=URLS)
    for user in range(6):
        for _ in range(4):
            resp = await api.run(
                client.chat.completions.create(
                    messages=MESSAGES, extra_body={"prompt_cache_key": f"user-{user}"}
                )
            )
            assert resp.attempt_history[0].affinity == "hit"
        assert seen.hosts[-4:] == [home_of(client, f"user-{user}")] * 4
    assert len(set(seen.hosts)) > 1  # different keys, different homes
    stats = client.stats()
    assert (stats.affinity_hits, stats.affinity_overflows) == (24, 0)
    # The key is the caller's: it goes to the server as given.
    assert seen.bodies[-1]["prompt_cache_key"] == "user-5"
    # A call without a key goes by load, as before: no affinity in its record.
    plain = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert plain.attempt_history[0].affinity is None


async def test_affinity_none_ignores_the_key(api: Api, seen: Seen) -> None:
    client = api.client(base_url=URLS, affinity=None)
    for _ in range(40):
        resp = await api.run(
            client.chat.completions.create(
                messages=MESSAGES, extra_body={"prompt_cache_key": "user-1"}
            )
        )
        assert resp.attempt_history[0].affinity is None
    assert len(set(seen.hosts)) == 3  # scattered by load, as without a key
    assert (client.stats().affinity_hits, client.stats().affinity_overflows) == (0, 0)
    keyed = client.with_options(affinity=AffinityPolicy())
    seen.hosts.clear()
    for _ in range(5):
        await api.run(
            keyed.chat.completions.create(
                messages=MESSAGES, extra_body={"prompt_cache_key": "user-1"}
            )
        )
    assert seen.hosts == [home_of(client, "user-1")] * 5
    off = keyed.with_options(affinity=None)
    seen.hosts.clear()
    for _ in range(30):
        await api.run(
            off.chat.completions.create(messages=MESSAGES, extra_body={"prompt_cache_key": "u"})
        )
    assert len(set(seen.hosts)) > 1


async def test_a_derived_key_keeps_a_conversations_turns_on_one_endpoint(
    api: Api, seen: Seen
) -> None:
    client = api.client(base_url=URLS, affinity=AffinityPolicy(derive_from_prompt=True))
    system = {"role": "system", "content": "You answer questions about the attached report."}
    homes = {}
    for name in ("alice", "bob", "carol", "dave", "erin"):
        messages: list[dict[str, str]] = [system, {"role": "user", "content": f"I am {name}."}]
        for turn in range(4):
            resp = await api.run(client.chat.completions.create(messages=messages))
            messages += [
                {"role": "assistant", "content": resp.choices[0].message.content},
                {"role": "user", "content": f"question {turn}"},
            ]
        assert len(set(seen.hosts[-4:])) == 1, seen.hosts
        homes[name] = seen.hosts[-1]
    assert len(set(homes.values())) > 1
    assert client.stats().affinity_hits == 20


async def test_a_retry_leaves_the_home_for_the_keys_next_endpoint(api: Api, seen: Seen) -> None:
    client = api.client(base_url=URLS, retry_policy=RetryPolicy(max_attempts=3))
    digest = AffinityPolicy().key_of({"prompt_cache_key": "doc-3"})
    assert digest is not None
    order = [s.name.split(".")[0] for s in ranking(digest, client._core.picker.states)]
    seen.answers[order[0]] = httpx.Response(503, json={"error": {"message": "busy"}})
    resp = await api.run(
        client.chat.completions.create(messages=MESSAGES, extra_body={"prompt_cache_key": "doc-3"})
    )
    assert seen.hosts == order[:2]
    assert [a.affinity for a in resp.attempt_history] == ["hit", "overflow"]
    assert [a.endpoint.split(".")[0] for a in resp.attempt_history] == order[:2]
    stats = client.stats()
    assert (stats.affinity_hits, stats.affinity_overflows) == (1, 1)


async def test_a_full_home_sends_the_key_on_and_the_record_says_overflow(
    api: Api, seen: Seen
) -> None:
    client = api.client(base_url=URLS)
    home = home_of(client, "hot")
    state = next(s for s in client._core.picker.states if s.name.startswith(home))
    # This client has four attempts in flight there already: its bound for a fifth is
    # its fair share (5 / 3) plus the default slack of 2, rounded up: 4.
    for _ in range(4):
        client._core.picker.started(state)
    resp = await api.run(
        client.chat.completions.create(messages=MESSAGES, extra_body={"prompt_cache_key": "hot"})
    )
    assert seen.hosts[0] != home and resp.attempt_history[0].affinity == "overflow"


async def test_one_endpoint_computes_no_key(
    api: Api, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no(self: object, body: object) -> bytes:
        raise AssertionError("a key was computed for a client of one endpoint")

    monkeypatch.setattr(AffinityPolicy, "key_of", no)
    client = api.client(base_url=URLS[0], affinity=AffinityPolicy(derive_from_prompt=True))
    resp = await api.run(
        client.chat.completions.create(messages=MESSAGES, extra_body={"prompt_cache_key": "k"})
    )
    assert resp.attempt_history[0].affinity is None and seen.hosts == ["h0"]


def test_a_bad_affinity_option_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="AffinityPolicy"):
        stormguard.Client(base_url=URLS, affinity=0.25)  # type: ignore[typeddict-item]
    client = stormguard.Client(base_url=URLS)
    with pytest.raises(TypeError, match="AffinityPolicy"):
        client.with_options(affinity="on")  # type: ignore[typeddict-item]


async def test_the_attempt_span_says_hit_or_overflow(api: Api, seen: Seen) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = api.client(
        base_url=URLS,
        telemetry=Telemetry(tracer_provider=provider),
        retry_policy=RetryPolicy(max_attempts=2),
    )
    digest = AffinityPolicy().key_of({"prompt_cache_key": "span"})
    assert digest is not None
    seen.answers[ranking(digest, client._core.picker.states)[0].name.split(".")[0]] = (
        httpx.Response(503, json={})
    )
    await api.run(
        client.chat.completions.create(messages=MESSAGES, extra_body={"prompt_cache_key": "span"})
    )
    await api.run(client.chat.completions.create(messages=MESSAGES))
    attempts = [s for s in exporter.get_finished_spans() if s.parent is not None]
    marks = [(s.attributes or {}).get("stormguard.affinity") for s in attempts]
    assert marks == ["hit", "overflow", None]
    for span in exporter.get_finished_spans():  # never the key, never the prompt
        assert "span" not in str(dict(span.attributes or {}).values())
    provider.shutdown()


def test_openai_over_the_transport_honours_the_key() -> None:
    answer = Seen()
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        http = stormguard.httpx_client(library="httpx", base_url=URLS)
        client = openai.OpenAI(base_url=URLS[0], api_key="sk-x", http_client=http, max_retries=0)
        for _ in range(6):
            client.chat.completions.create(
                model="m",
                messages=MESSAGES,  # type: ignore[arg-type]
                extra_body={"prompt_cache_key": "tenant-7"},
            )
    stats = http._transport.client.stats()  # type: ignore[attr-defined]
    assert len(set(answer.hosts)) == 1 and stats.affinity_hits == 6
    assert Counter(answer.hosts)[home_of(http._transport.client, "tenant-7")] == 6  # type: ignore[attr-defined]


def test_weighted_endpoints_keep_their_share_of_keys() -> None:
    answer = Seen()
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = stormguard.Client(
            base_url=[Endpoint(URLS[0], weight=2.0), URLS[1], URLS[2]], model="m", api_key="k"
        )
        for i in range(400):
            client.chat.completions.create(
                messages=MESSAGES, extra_body={"prompt_cache_key": f"k{i}"}
            )
    counts = Counter(answer.hosts)
    assert 160 < counts["h0"] < 240 and 60 < counts["h1"] < 140 and 60 < counts["h2"] < 140


def test_stormguard_openai_takes_the_affinity_option() -> None:
    off = stormguard.OpenAI(base_url=URLS, api_key="sk-x", affinity=None)
    derived = stormguard.OpenAI(
        base_url=URLS, api_key="sk-x", affinity=AffinityPolicy(derive_from_prompt=True)
    )
    default = stormguard.OpenAI(base_url=URLS, api_key="sk-x")
    assert off.stormguard._core.affinity is None
    assert derived.stormguard._core.affinity == AffinityPolicy(derive_from_prompt=True)
    assert default.stormguard._core.affinity == AffinityPolicy()
    for client in (off, derived, default):
        client.close()


# -- Streams: in flight to their endpoint until they end ---------------------------------


@pytest.fixture
def streams() -> Iterator[list[str]]:
    """Every host answers a stream of two chunks; the hosts asked, in order."""
    hosts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host.split(".")[0])
        return event_stream(sse(chunk("a"), chunk("b")))

    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        yield hosts


def _state(client: Any, stream: Any) -> Any:
    name = stream.call_info.attempt_history[0].endpoint
    return next(s for s in client._core.picker.states if s.name == name)


async def _close(api: Api, stream: Any) -> None:
    await api.run(stream.close() if api.mode == "sync" else stream.aclose())


async def test_a_stream_is_in_flight_to_its_endpoint_until_it_ends(
    api: Api, streams: list[str]
) -> None:
    """The endpoint serves a stream until its last chunk, not its first: a replica
    decoding this client's streams is loaded, for the choice by load (power of two
    choices) and for affinity's bound alike (Envoy's least-request counts a stream as
    active until it completes)."""
    client = api.client(base_url=URLS)
    read = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    closed = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert [_state(client, s).in_flight >= 1 for s in (read, closed)] == [True, True]
    assert sum(s.in_flight for s in client._core.picker.states) == 2
    assert len(await api.collect(read)) == 2
    await _close(api, closed)  # left before its end: over all the same
    assert sum(s.in_flight for s in client._core.picker.states) == 0


async def test_a_keys_streams_being_read_count_against_its_homes_bound(
    api: Api, streams: list[str]
) -> None:
    """Of three endpoints, a home holding one of this client's two calls holds 1.5
    times its share: past the bound without slack (ceil(1.25 * 2 / 3) = 1), so the
    key's second stream, opened while its first is still being read, goes to its
    next endpoint."""
    client = api.client(base_url=URLS, affinity=AffinityPolicy(slack=0))
    body = {"prompt_cache_key": "hot"}
    first = await api.run(
        client.chat.completions.create(messages=MESSAGES, stream=True, extra_body=body)
    )
    second = await api.run(
        client.chat.completions.create(messages=MESSAGES, stream=True, extra_body=body)
    )
    assert [s.call_info.attempt_history[0].affinity for s in (first, second)] == [
        "hit",
        "overflow",
    ]
    assert streams[0] == home_of(client, "hot") != streams[1]
    for stream in (first, second):
        await api.collect(stream)
    third = await api.run(
        client.chat.completions.create(messages=MESSAGES, stream=True, extra_body=body)
    )
    assert third.call_info.attempt_history[0].affinity == "hit"  # both ended: home again
    await _close(api, third)


async def test_a_stream_cut_after_its_first_chunk_leaves_its_endpoint(api: Api) -> None:
    client = api.client(base_url=URLS)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(return_value=event_stream(sse(chunk("a"), done=False)))
        stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
        assert _state(client, stream).in_flight == 1
        with pytest.raises(stormguard.StreamInterruptedError):
            await api.collect(stream)
    assert sum(s.in_flight for s in client._core.picker.states) == 0
