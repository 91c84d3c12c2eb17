"""A client used before ``os.fork()`` serves the parent and every child, each on
connections of its own (``_io/pool_life.py``), without disturbing the others.

Children are made by ``multiprocessing`` with the fork start method, as gunicorn
``--preload`` and a fork-started process pool make them: the client, its pool and
its policies are copied into each, in the state the fork found them. Every call
sends a tag unique to it (process id, count) and the echo server answers with it
and the port of the connection that carried the call, so a test sees both whose
answer each caller read and whose connection it came on.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import stormguard
from tests.e2e.echo_server import EchoServer, answer_of, run_echo_server, self_signed

pytestmark = [
    pytest.mark.e2e,
    # Python 3.12+ warns of any fork from a process with threads: these tests fork
    # from one on purpose.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

FORK = multiprocessing.get_context("fork")
CHILDREN = 4
CALLS = 24  # per process
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _no_child_left() -> Iterator[None]:
    """A child that hung fails its test (by a timeout on its answer); it must not
    then hang the run, which joins every child at exit."""
    yield
    for child in multiprocessing.active_children():
        child.kill()
        child.join(10)


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with run_echo_server() as server:
        yield server


@dataclass
class Tally:
    """What one process's calls read: answers not its own, errors, the ports used."""

    pid: int = field(default_factory=os.getpid)
    wrong: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ports: set[int] = field(default_factory=set)

    def record(self, tag: str, content: str | None) -> None:
        got, port = answer_of(content)
        self.ports.add(port)
        if got != tag:
            self.wrong.append(f"{tag} read {got}")

    def failed(self, error: BaseException) -> None:
        self.errors.append(f"{type(error).__name__}: {error}")


def _call(client: stormguard.Client, tally: Tally, index: int, delay: float = 0.0) -> None:
    tag = f"{os.getpid()}-{index}"
    headers = {"x-caller": tag, "x-delay": str(delay)}
    try:
        answer = client.chat.completions.create(messages=MESSAGES, extra_headers=headers)
    except stormguard.StormguardError as exc:
        tally.failed(exc)
    else:
        tally.record(tag, answer.choices[0].message.content)


def _calls(client: stormguard.Client, count: int) -> Tally:
    """``count`` calls, 4 at a time (each thread takes a connection of its own)."""
    tally = Tally()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda index: _call(client, tally, index), range(count)))
    return tally


def _slow_calls(
    client: stormguard.Client, server: EchoServer, count: int, delay: float
) -> tuple[Tally, list[Any]]:
    """``count`` calls held ``delay`` seconds by the server, each in a thread of its
    own; returns once the server holds every one: each thread then waits for its
    answer. Not sooner: a fork while another thread is in a TLS handshake can leave
    an OpenSSL lock held in the child for good (OpenSSL's, not stormguard's)."""
    tally = Tally()
    threads = [
        threading.Thread(target=_call, args=(client, tally, index, delay)) for index in range(count)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while server.delayed() < count:
        assert time.monotonic() < deadline, "the slow calls never reached the server"
        time.sleep(0.01)
    return tally, threads


def _sync_child(client: stormguard.Client, results: Any) -> None:
    results.put(_calls(client, CALLS))


async def _acalls(client: stormguard.AsyncClient, count: int) -> Tally:
    tally = Tally()

    async def one(index: int) -> None:
        tag = f"{os.getpid()}-{index}"
        try:
            answer = await client.chat.completions.create(
                messages=MESSAGES, extra_headers={"x-caller": tag}
            )
        except stormguard.StormguardError as exc:
            tally.failed(exc)
        else:
            tally.record(tag, answer.choices[0].message.content)

    for start in range(0, count, 4):
        await asyncio.gather(*(one(index) for index in range(start, min(start + 4, count))))
    return tally


def _async_child(client: stormguard.AsyncClient, results: Any) -> None:
    results.put(asyncio.run(_acalls(client, CALLS)))


def _collect(children: list[Any], results: Any) -> list[Tally]:
    tallies = [results.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    return tallies


def _assert_own(parent: Tally, children: list[Tally]) -> None:
    for tally in (parent, *children):
        assert tally.errors == [], tally.pid
        assert tally.wrong == [], tally.pid
    for child in children:
        assert child.ports and not child.ports & parent.ports, "a connection was shared"
    assert len({port for child in children for port in child.ports}) == sum(
        len(child.ports) for child in children
    )


def test_a_sync_client_used_before_a_fork_serves_each_process_on_its_own_connections(
    echo: EchoServer,
) -> None:
    with stormguard.Client(base_url=echo.base_url, model="m", timeout=30) as client:
        before = _calls(client, 8)  # the pool now holds idle connections to hand on
        assert before.errors == [] and before.wrong == [] and len(before.ports) > 1
        results = FORK.Queue()
        children = [FORK.Process(target=_sync_child, args=(client, results)) for _ in range(4)]
        for child in children:
            child.start()
        parent = _calls(client, CALLS)  # meanwhile, on the connections it had
        tallies = _collect(children, results)
        _assert_own(parent, tallies)
        # The children let go of the connections they inherited without closing them
        # for the parent: the parent still uses those it opened before the fork.
        after = _calls(client, 4)
        assert after.errors == [] and after.ports <= before.ports | parent.ports
        assert before.ports & (parent.ports | after.ports)


async def test_an_async_client_used_before_a_fork_serves_each_process_on_its_own_connections(
    echo: EchoServer,
) -> None:
    async with stormguard.AsyncClient(base_url=echo.base_url, model="m", timeout=30) as client:
        before = await _acalls(client, 8)
        assert before.errors == [] and before.wrong == [] and len(before.ports) > 1
        results = FORK.Queue()
        children = [FORK.Process(target=_async_child, args=(client, results)) for _ in range(4)]
        for child in children:
            child.start()  # from inside the running event loop: each child runs its own
        parent = await _acalls(client, CALLS)
        tallies = await asyncio.to_thread(_collect, children, results)
        _assert_own(parent, tallies)
        after = await _acalls(client, 4)
        assert after.errors == [] and before.ports & (parent.ports | after.ports)


def _busy_child(client: stormguard.Client, results: Any) -> None:
    start = time.monotonic()
    tally = _calls(client, 8)
    results.put((tally, time.monotonic() - start))


def test_a_child_forked_while_the_parent_has_calls_in_flight_gets_slots_and_connections(
    echo: EchoServer,
) -> None:
    """The parent's calls in flight at the fork hold concurrency slots and
    connections that nothing in the child will ever give back: the child forgets
    the slots, lets go of the connections without ending them for the parent (whose
    calls finish), and its own calls go out at once."""
    limiter = stormguard.ConcurrencyLimiter(initial_limit=4, min_limit=1, max_limit=4)
    with stormguard.Client(
        base_url=echo.base_url, model="m", timeout=30, concurrency=limiter
    ) as client:
        slow, threads = _slow_calls(client, echo, 4, 3.0)  # every slot held
        results = FORK.Queue()
        child = FORK.Process(target=_busy_child, args=(client, results))
        child.start()
        tally, took = results.get(timeout=60)
        child.join(30)
        for thread in threads:
            thread.join(30)
        assert child.exitcode == 0
        assert tally.errors == [] and tally.wrong == []
        assert took < 3.0  # did not wait for the parent's slots: they never come back there
        assert slow.errors == [] and slow.wrong == []  # the child's let-go ended none of them


def _locked_child(client: stormguard.Client, results: Any) -> None:
    results.put(_calls(client, 2))


def test_a_child_forked_while_another_thread_holds_the_policies_locks_does_not_hang(
    echo: EchoServer,
) -> None:
    """A lock another thread holds at the fork is never released in the child, whose
    first call taking it would hang: the policies' locks come back unheld there."""
    with stormguard.Client(base_url=echo.base_url, model="m", timeout=30) as client:
        assert _calls(client, 1).errors == []
        core = client._core
        assert core.breakers is not None and core.limiter is not None
        limits = list(core.limiter._endpoints.values())
        locks = [
            core.budget._lock,
            core.stats._lock,
            core.picker._lock,
            core.breakers._lock,
            *(breaker._lock for breaker in core.breakers._breakers.values()),
            core.limiter._lock,
            *(limit._lock for limit in limits),
        ]
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            for lock in locks:
                lock.acquire()
            held.set()
            release.wait()
            for lock in locks:
                lock.release()

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        try:
            results = FORK.Queue()
            child = FORK.Process(target=_locked_child, args=(client, results))
            child.start()
            child.join(20)
            hung = child.exitcode is None
            if hung:
                child.kill()
                child.join()
            assert not hung, "the child hung on a lock held at the fork"
            tally = results.get(timeout=5)
            assert tally.errors == [] and tally.wrong == []
        finally:
            release.set()
            holder.join(10)


def _given_child(client: stormguard.Client, results: Any) -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tally = _calls(client, 3)
    results.put((tally, [str(w.message) for w in caught if w.category is RuntimeWarning]))


def test_an_http_client_you_passed_and_used_before_a_fork_warns_once_in_the_child(
    echo: EchoServer,
) -> None:
    """A pool you pass is yours: stormguard does not replace it in a child, and says
    once, in the child, that it is shared."""
    with httpx.Client() as http:
        client = stormguard.Client(base_url=echo.base_url, model="m", http_client=http)
        assert _calls(client, 1).errors == []
        results = FORK.Queue()
        child = FORK.Process(target=_given_child, args=(client, results))
        child.start()
        _tally, warned = results.get(timeout=60)
        child.join(30)
        assert child.exitcode == 0
        assert len(warned) == 1
        assert "forked" in warned[0] and "http_client" in warned[0]


@pytest.fixture(scope="module")
def tls_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EchoServer, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    with run_echo_server(tls=(cert, key)) as server:
        yield server, cert


def test_over_tls_children_let_go_of_the_parents_connections_without_ending_them(
    tls_echo: tuple[EchoServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's let-go sends nothing on a TLS connection (no close_notify, which
    would make the server close it): the parent's calls in flight at the fork
    finish, and the parent goes on using the connections it opened before."""
    server, cert = tls_echo
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the own pool trusts the test's CA
    with stormguard.Client(base_url=server.base_url, model="m", timeout=30) as client:
        before = _calls(client, 8)
        assert before.errors == [] and len(before.ports) > 1
        slow, threads = _slow_calls(client, server, 2, 1.0)
        results = FORK.Queue()
        children = [FORK.Process(target=_sync_child, args=(client, results)) for _ in range(2)]
        for child in children:
            child.start()
        tallies = _collect(children, results)
        for thread in threads:
            thread.join(30)
        after = _calls(client, 8)
        _assert_own(after, tallies)
        assert slow.errors == [] and slow.wrong == []
        assert before.ports & after.ports  # still the connections opened before the fork


async def test_over_tls_async_children_let_go_of_the_parents_connections_without_ending_them(
    tls_echo: tuple[EchoServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, cert = tls_echo
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    async with stormguard.AsyncClient(base_url=server.base_url, model="m", timeout=30) as client:
        before = await _acalls(client, 8)
        assert before.errors == [] and len(before.ports) > 1
        results = FORK.Queue()
        children = [FORK.Process(target=_async_child, args=(client, results)) for _ in range(2)]
        for child in children:
            child.start()
        tallies = await asyncio.to_thread(_collect, children, results)
        after = await _acalls(client, 8)
        _assert_own(after, tallies)
        assert before.ports & after.ports
