"""x-priority above standard is believed only from trusted callers (priority_trust.py).

The incident: any client could claim ``critical`` and push everyone else out (60
late "critical" calls all succeeded while 106 of 120 earlier standard ones were
shed). In-process apps here see the client address the ASGI transport gives them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.protocol import Priority
from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, PriorityTrustConfig, ServerConfig
from stormguard_server.guards.priority_trust import PriorityTrust, parse_networks
from stormguard_server.state import ServerState
from tests.server.conftest import FAST_ENGINE
from tests.server.fake_clock import FakeClock, settle

TOKEN = "t0ken-for-trusted-callers"
COMPLETIONS = "/v1/completions"


@asynccontextmanager
async def served(
    client: str, trust: PriorityTrustConfig | None = None, *, queue: int = 256
) -> AsyncIterator[tuple[httpx.AsyncClient, ServerState, FakeClock]]:
    """An app on a fake clock whose every request comes from ``client``."""
    clock = FakeClock()
    config = ServerConfig(
        engine=FAST_ENGINE,
        admission=AdmissionConfig(max_queue_requests=queue),
        priority_trust=trust or PriorityTrustConfig(),
    )
    state = build_state(config, clock=clock)
    app = create_app(state=state)
    await clock.drive(state.engine.start())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=(client, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield http, state, clock


class Recorder:
    def __init__(self) -> None:
        self.done: list[Any] = []

    def request_arrived(self, record: Any) -> None:
        pass

    def request_done(self, record: Any) -> None:
        self.done.append(record)


async def priority_served(
    client: str, headers: dict[str, str], trust: PriorityTrustConfig | None = None
) -> tuple[Priority, float]:
    """The priority admission gave one request, and the claims ignored so far."""
    async with served(client, trust) as (http, state, clock):
        recorder = Recorder()
        state.observers.append(recorder)
        body = {"prompt": "x", "max_tokens": 2}
        answer = await clock.drive(http.post(COMPLETIONS, json=body, headers=headers))
        assert answer.status_code == 200
        ignored = state.metrics.priority_claims_ignored._value.get()
        return recorder.done[0].priority, ignored


async def test_critical_from_an_untrusted_address_is_served_as_standard() -> None:
    priority, ignored = await priority_served("203.0.113.7", {"x-priority": "critical"})
    assert priority is Priority.STANDARD
    assert ignored == 1


@pytest.mark.parametrize(
    ("client", "trust", "headers"),
    [
        ("127.0.0.1", None, {}),  # loopback, trusted by default: the drill, the tests
        ("::1", None, {}),
        ("::ffff:127.0.0.1", None, {}),  # a dual-stack socket's view of IPv4 loopback
        ("10.1.2.3", PriorityTrustConfig(networks=("10.0.0.0/8",)), {}),
        ("203.0.113.7", PriorityTrustConfig(token=TOKEN), {"x-priority-token": TOKEN}),
    ],
)
async def test_critical_from_a_trusted_caller_is_believed(
    client: str, trust: PriorityTrustConfig | None, headers: dict[str, str]
) -> None:
    priority, ignored = await priority_served(client, {"x-priority": "critical", **headers}, trust)
    assert (priority, ignored) == (Priority.CRITICAL, 0)


@pytest.mark.parametrize(
    ("client", "trust", "headers"),
    [
        ("127.0.0.1", PriorityTrustConfig(networks=()), {}),  # --trust-priority-from none
        ("203.0.113.7", PriorityTrustConfig(token=TOKEN), {"x-priority-token": "wrong" * 4}),
        ("203.0.113.7", PriorityTrustConfig(token=TOKEN), {"x-priority-token": TOKEN[:-1]}),
        ("203.0.113.7", PriorityTrustConfig(), {"x-priority-token": TOKEN}),  # no token set
        ("11.0.0.1", PriorityTrustConfig(networks=("10.0.0.0/8",)), {}),
    ],
)
async def test_critical_from_anyone_else_is_not(
    client: str, trust: PriorityTrustConfig, headers: dict[str, str]
) -> None:
    priority, ignored = await priority_served(client, {"x-priority": "CRITICAL", **headers}, trust)
    assert (priority, ignored) == (Priority.STANDARD, 1)


async def test_asking_for_less_is_always_kept() -> None:
    priority, ignored = await priority_served("203.0.113.7", {"x-priority": "sheddable"})
    assert (priority, ignored) == (Priority.SHEDDABLE, 0)


async def test_late_untrusted_critical_calls_cannot_push_earlier_ones_out() -> None:
    # The incident in small: one request holds the engine, two standard ones wait in a
    # full queue, then "critical" newcomers arrive. Believed, each would evict a
    # standard one; from an untrusted caller they are standard, and the newest goes.
    async with served("203.0.113.7", queue=2) as (http, state, clock):
        # Each costs ~470 of the 921-token budget: one runs, the others queue.
        big = {"prompt": "x", "max_tokens": 460, "ignore_eos": True}
        running = asyncio.create_task(http.post(COMPLETIONS, json=big))
        await settle()
        waiting = [asyncio.create_task(http.post(COMPLETIONS, json=big)) for _ in range(2)]
        await settle()
        assert state.admission is not None and state.admission.server_load().queue_depth == 2
        late = [
            await http.post(COMPLETIONS, json=big, headers={"x-priority": "critical"})
            for _ in range(3)
        ]
        assert [r.status_code for r in late] == [503, 503, 503]
        assert not any(task.done() for task in waiting)  # the earlier ones still wait
        answers = await clock.drive(asyncio.gather(running, *waiting))
        assert [a.status_code for a in answers] == [200, 200, 200]


async def test_the_token_never_reaches_the_app() -> None:
    seen: list[list[tuple[bytes, bytes]]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(list(scope["headers"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    from stormguard_server.guards.priority_trust import PriorityGate

    gate = PriorityGate(app, PriorityTrust(token=TOKEN))
    for client in ("203.0.113.7", "127.0.0.1"):
        transport = httpx.ASGITransport(app=gate, client=(client, 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            await http.get("/", headers={"x-priority-token": TOKEN, "x-priority": "critical"})
            await http.get("/", headers={"x-priority-token": "wrong"})
    names = [[name for name, _ in headers] for headers in seen]
    assert all(b"x-priority-token" not in n for n in names)
    assert [b"x-priority" in n for n in names] == [True, False, True, False]


@pytest.mark.parametrize(
    "bad", ["10.0.0.1/8", "10.0.0.0/33", "example.com", "", "1.2.3.4/x", "::1/129"]
)
def test_a_bad_network_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="not a network"):
        parse_networks([bad])
    with pytest.raises(ValueError, match="not a network"):
        create_app(
            dataclasses.replace(ServerConfig(), priority_trust=PriorityTrustConfig(networks=(bad,)))
        )


def test_a_short_token_is_refused_without_quoting_it() -> None:
    with pytest.raises(ValueError, match="a priority token is at least 16") as caught:
        PriorityTrust(token="short-secret")
    assert "short-secret" not in str(caught.value)


def test_none_names_no_network_and_addresses_are_networks() -> None:
    assert parse_networks(["none"]) == ()
    assert [str(n) for n in parse_networks(["10.1.2.3", "fd00::/8"])] == [
        "10.1.2.3/32",
        "fd00::/8",
    ]


@settings(max_examples=80, deadline=None)
@given(
    host=st.one_of(
        st.ip_addresses().map(str), st.text(max_size=20), st.none(), st.just("::ffff:10.0.0.1")
    ),
    headers=st.lists(
        st.tuples(
            st.sampled_from([b"x-priority", b"x-priority-token", b"x-other"]),
            st.one_of(
                st.sampled_from([b"critical", b" CRITICAL ", b"standard", b"sheddable"]),
                st.just(TOKEN.encode()),
                st.binary(max_size=30),
            ),
        ),
        max_size=5,
    ),
)
def test_whatever_the_caller_sends_only_the_trusted_keep_a_raised_claim(
    host: str | None, headers: list[tuple[bytes, bytes]]
) -> None:
    trust = PriorityTrust(networks=("10.0.0.0/8",), token=TOKEN)
    scope = {"type": "http", "headers": headers, "client": None if host is None else (host, 1)}
    kept = trust.gate(scope)["headers"]
    assert all(name != b"x-priority-token" for name, _ in kept)
    assert [h for h in kept if h[0] == b"x-other"] == [h for h in headers if h[0] == b"x-other"]
    claims = [v.strip().lower() for n, v in kept if n == b"x-priority"]
    tokens = [v.strip() for n, v in headers if n == b"x-priority-token"]
    trusted = trust.trusts_address(host) or tokens == [TOKEN.encode()]
    if b"critical" in claims:
        assert trusted
