"""Prefix-cache affinity end to end, sync and async: three real reference servers.
Each conversation's turns (a derived key) and each tenant's calls (a
``prompt_cache_key``) go to one server, the key's home, and the servers' own counts
agree; when one server stops, only the keys it was home to move (to their next
server), and every call still succeeds.

Assertions are on where calls went and on counts, never on timings.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import stormguard
from stormguard import AffinityPolicy, Endpoint
from stormguard._policies.routing.affinity import ranking
from tests.e2e.conftest import ServerFactory, spec
from tests.e2e.server_process import RunningServer, stop_server

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
NAMES = ("a", "b", "c")
SYSTEM = {"role": "system", "content": "You answer questions about one long report."}
PEOPLE = ("ana", "ben", "cyd", "dee", "eli", "fay", "gus", "hal")


def attempts_seen(server: RunningServer) -> int:
    return int(
        sum(v for k, v in server.metrics().items() if k.startswith("stormguard_attempts_total{"))
    )


def conversation_turns(person: str, turns: int) -> list[list[dict[str, str]]]:
    """The message list of each turn of one conversation (each repeats the last)."""
    messages = [SYSTEM, {"role": "user", "content": f"I am {person}; summarize the report."}]
    every = []
    for turn in range(turns):
        every.append(list(messages))
        messages += [
            {"role": "assistant", "content": f"summary {turn}"},
            {"role": "user", "content": f"and section {turn}?"},
        ]
    return every


def home(client: Any, body: dict[str, Any]) -> str:
    key = client._core.affinity.key_of(body)
    usable = [s for s in client._core.picker.states if client._core.ejection.usable(s)]
    return ranking(key, usable)[0].name


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_conversations_and_tenants_stay_on_their_home_server(
    mode: str, stormguard_server_factory: ServerFactory
) -> None:
    servers = stormguard_server_factory.together(spec(), spec(), spec())
    urls = [s.base_url for s in servers]
    if mode == "sync":
        with stormguard.Client(
            base_url=[Endpoint(u, name=n) for u, n in zip(urls, NAMES, strict=True)],
            model=MODEL,
            timeout=10,
            affinity=AffinityPolicy(derive_from_prompt=True),
        ) as client:
            records, homes, stats = _sync_script(client)
    else:
        records, homes, stats = asyncio.run(_async_script(urls))
    for label, history in records:
        assert [a.affinity for a in history] == ["hit"], (label, history)
        assert history[0].endpoint == homes[label], label
    served = {name: 0 for name in NAMES}
    for _, history in records:
        served[history[0].endpoint] += 1
    # The servers saw exactly what the client says it sent them.
    assert [attempts_seen(s) for s in servers] == [served[n] for n in NAMES]
    assert sum(1 for count in served.values() if count) >= 2  # keys spread
    assert (stats.affinity_hits, stats.affinity_overflows) == (len(records), 0)


def _sync_script(client: stormguard.Client) -> tuple[list[Any], dict[str, str], Any]:
    records, homes = [], {}
    for person in PEOPLE:
        for messages in conversation_turns(person, 3):
            homes[person] = home(client, {"messages": messages})
            resp = client.chat.completions.create(messages=messages, max_tokens=4)
            records.append((person, resp.attempt_history))
    for tenant in ("acme", "globex", "initech"):
        body = {"prompt_cache_key": tenant}
        homes[tenant] = home(client, body)
        for _ in range(3):
            resp = client.chat.completions.create(
                messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body=body
            )
            records.append((tenant, resp.attempt_history))
    return records, homes, client.stats()


async def _async_script(urls: list[str]) -> tuple[list[Any], dict[str, str], Any]:
    records, homes = [], {}
    async with stormguard.AsyncClient(
        base_url=[Endpoint(u, name=n) for u, n in zip(urls, NAMES, strict=True)],
        model=MODEL,
        timeout=10,
        affinity=AffinityPolicy(derive_from_prompt=True),
    ) as client:
        for person in PEOPLE:
            for messages in conversation_turns(person, 3):
                homes[person] = home(client, {"messages": messages})
                resp = await client.chat.completions.create(messages=messages, max_tokens=4)
                records.append((person, resp.attempt_history))
        for tenant in ("acme", "globex", "initech"):
            body = {"prompt_cache_key": tenant}
            homes[tenant] = home(client, body)
            for _ in range(3):
                resp = await client.chat.completions.create(
                    messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body=body
                )
                records.append((tenant, resp.attempt_history))
        return records, homes, client.stats()


def test_a_server_that_stops_moves_only_the_keys_it_was_home_to(
    stormguard_server_factory: ServerFactory,
) -> None:
    servers = stormguard_server_factory.together(spec(), spec(), spec())
    with stormguard.Client(
        base_url=[Endpoint(s.base_url, name=n) for s, n in zip(servers, NAMES, strict=True)],
        model=MODEL,
        timeout=10,
        affinity=AffinityPolicy(derive_from_prompt=True),
    ) as client:
        bodies = {p: conversation_turns(p, 1)[0] for p in PEOPLE}

        def where() -> dict[str, str]:
            went = {}
            for person, messages in bodies.items():
                resp = client.chat.completions.create(messages=messages, max_tokens=4)
                went[person] = resp.attempt_history[-1].endpoint
            return went

        before = where()
        gone = next(n for n in NAMES if n in before.values())
        stop_server(servers[NAMES.index(gone)])
        after = where()
        again = where()  # once it is out of rotation: no attempt goes there first
        stats = client.stats()
    for person in PEOPLE:
        if before[person] != gone:
            assert after[person] == again[person] == before[person], person
        else:
            assert after[person] != gone and again[person] == after[person], person
    assert any(before[p] == gone for p in PEOPLE)
    # A server out of rotation is not ranked: while it is out, its keys' next server
    # is their home. The first call sent to it after it stopped was refused (which
    # ejected it), and that call's failover went to the next server: no call failed.
    assert stats.affinity_overflows == 0 and stats.affinity_hits == stats.attempts
    assert stats.retries == stats.failovers >= 1
