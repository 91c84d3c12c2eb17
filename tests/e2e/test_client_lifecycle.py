"""``close()`` ends the calls in flight at once; an ``AsyncClient`` serves each event
loop that uses it (``_io/pool_life.py``).

Closing is tested against a server that never answers (or stops in the middle of a
stream), so that only the close can end a call before its deadline; event loops
against a keep-alive server, so that the pool holds a connection of the loop that
came before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import stormguard
from tests.e2e.echo_server import EchoServer, answer_of, run_echo_server
from tests.e2e.hostile_server import HEAD_SSE, HostileServer, RawRequest, never_answer

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "hi"}]
DEADLINE = 60.0  # far beyond any wait of these tests: only the close can end a call
CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
)


async def one_chunk_then_silence(_: RawRequest, writer: asyncio.StreamWriter) -> None:
    writer.write(HEAD_SSE + CHUNK)
    await writer.drain()
    await asyncio.Event().wait()


def wait_until(condition: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


async def await_until(condition: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def assert_ended_by_close(error: BaseException | None, client: Any) -> None:
    assert isinstance(error, stormguard.ClientClosedError), repr(error)
    assert isinstance(error, stormguard.APIConnectionError)  # as openai-python 1.x's
    assert "closed" in str(error)
    stats = client.stats()
    assert all(b.failures == 0 and b.state == "closed" for b in stats.breakers)
    assert all(limit.decreases == 0 and limit.in_flight == 0 for limit in stats.concurrency)


# -- close() --------------------------------------------------------------------------


def test_close_ends_a_sync_call_blocked_reading_and_refuses_the_next_at_once() -> None:
    with HostileServer({"/v1/chat/completions": never_answer()}) as server:
        client = stormguard.Client(
            base_url=server.base_url, model="m", timeout=DEADLINE, max_retries=3
        )
        ended: dict[str, Any] = {}

        def call() -> None:
            try:
                client.chat.completions.create(messages=MESSAGES)
            except BaseException as exc:
                ended["error"] = exc

        thread = threading.Thread(target=call)
        thread.start()
        wait_until(lambda: server.requests)  # the call now waits for an answer
        closing = time.monotonic()
        client.close()
        thread.join(DEADLINE)
        took = time.monotonic() - closing
        assert took < 10  # woken by the close, not by its deadline
        error = ended.get("error")
        assert_ended_by_close(error, client)
        assert isinstance(error, stormguard.ClientClosedError)
        assert error.retry_stopped_by == "cancelled" and error.attempts == 1
        assert len(server.requests) == 1  # not retried
        start = time.monotonic()
        with pytest.raises(stormguard.ClientClosedError, match="closed"):
            client.chat.completions.create(messages=MESSAGES)
        assert time.monotonic() - start < 1 and len(server.requests) == 1


async def test_aclose_ends_a_task_waiting_for_an_answer_and_refuses_the_next() -> None:
    with HostileServer({"/v1/chat/completions": never_answer()}) as server:
        client = stormguard.AsyncClient(
            base_url=server.base_url, model="m", timeout=DEADLINE, max_retries=3
        )
        task = asyncio.create_task(client.chat.completions.create(messages=MESSAGES))
        await await_until(lambda: server.requests)
        await client.close()
        with pytest.raises(stormguard.ClientClosedError) as caught:
            await asyncio.wait_for(task, 10)
        assert_ended_by_close(caught.value, client)
        assert caught.value.retry_stopped_by == "cancelled" and len(server.requests) == 1
        with pytest.raises(stormguard.ClientClosedError):
            await client.chat.completions.create(messages=MESSAGES)
        assert len(server.requests) == 1


def test_close_ends_a_stream_read_in_another_thread() -> None:
    with HostileServer({"/v1/chat/completions": one_chunk_then_silence}) as server:
        client = stormguard.Client(base_url=server.base_url, model="m", timeout=DEADLINE)
        stream = client.chat.completions.create(messages=MESSAGES, stream=True)
        first = threading.Event()
        ended: dict[str, Any] = {}

        def read() -> None:
            try:
                for _ in stream:
                    first.set()
            except BaseException as exc:
                ended["error"] = exc

        thread = threading.Thread(target=read)
        thread.start()
        assert first.wait(10)  # the reader now waits for a chunk that never comes
        client.close()
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert_ended_by_close(ended.get("error"), client)  # no limit decrease: not a cut


async def test_aclose_ends_a_stream_read_in_another_task() -> None:
    with HostileServer({"/v1/chat/completions": one_chunk_then_silence}) as server:
        client = stormguard.AsyncClient(base_url=server.base_url, model="m", timeout=DEADLINE)
        stream = await client.chat.completions.create(messages=MESSAGES, stream=True)

        async def read() -> None:
            async for _ in stream:
                pass

        task = asyncio.create_task(read())
        await asyncio.sleep(0)  # the reader takes the first chunk, then waits
        await client.close()
        with pytest.raises(stormguard.ClientClosedError) as caught:
            await asyncio.wait_for(task, 10)
        assert_ended_by_close(caught.value, client)


# -- event loops ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with run_echo_server() as server:
        yield server


async def _tagged(client: stormguard.AsyncClient, tag: str) -> int:
    """One call; the port of the connection that carried it (its answer checked)."""
    answer = await client.chat.completions.create(
        messages=MESSAGES, extra_headers={"x-caller": tag}
    )
    got, port = answer_of(answer.choices[0].message.content)
    assert got == tag
    return port


def test_one_async_client_serves_one_asyncio_run_after_another(echo: EchoServer) -> None:
    """A script's (or a notebook's, or pytest's) ``asyncio.run()`` after another with
    one module-level client: each loop gets a pool of its own; a closed loop's is
    let go of, so no table grows with the loops."""
    client = stormguard.AsyncClient(base_url=echo.base_url, model="m", timeout=30)
    ports = [asyncio.run(_tagged(client, f"run-{run}")) for run in range(3)]
    assert len(set(ports)) == 3  # a new connection for each loop
    from stormguard._io.pool_life import LoopTransport

    transport = client._http._transport
    assert isinstance(transport, LoopTransport) and len(transport._pools) == 1
    asyncio.run(client.close())
    assert transport._pools == {}


def test_one_async_client_serves_two_event_loops_at_once(echo: EchoServer) -> None:
    """Two threads, each with its own running loop, share one client: each loop uses
    connections of its own; ``close()`` from one closes the other's pool on its own
    loop, and the other's next call fails as closed."""
    client = stormguard.AsyncClient(base_url=echo.base_url, model="m", timeout=30)
    both_running = threading.Barrier(2, timeout=30)
    closed = threading.Event()
    ports: dict[str, set[int]] = {}
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        async def main() -> None:
            found = set(await asyncio.gather(*(_tagged(client, f"{name}-{i}") for i in range(4))))
            await asyncio.to_thread(both_running.wait)  # both loops are alive now
            found |= set(
                await asyncio.gather(*(_tagged(client, f"{name}-{i}") for i in range(4, 8)))
            )
            await asyncio.to_thread(both_running.wait)
            ports[name] = found
            if name == "a":
                await client.close()
                closed.set()
            else:
                await asyncio.to_thread(closed.wait, 30)
                try:
                    await _tagged(client, "b-after")
                except stormguard.ClientClosedError as exc:
                    errors[name] = exc

        asyncio.run(main())

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert ports["a"] and ports["b"] and not ports["a"] & ports["b"]
    assert isinstance(errors.get("b"), stormguard.ClientClosedError)


def test_an_http_client_you_passed_fails_on_a_second_loop_with_a_typed_error(
    echo: EchoServer,
) -> None:
    """Your own ``httpx.AsyncClient`` is used as it is: the connection it keeps from a
    closed loop cannot serve the next one, which says so (not httpx's bare
    ``RuntimeError``), is not retried, and counts against no policy."""
    http = httpx.AsyncClient()
    client = stormguard.AsyncClient(
        base_url=echo.base_url, model="m", timeout=30, max_retries=3, http_client=http
    )
    asyncio.run(_tagged(client, "first"))  # the pool keeps the first loop's connection
    with pytest.raises(stormguard.EventLoopMismatchError, match="event loop") as caught:
        asyncio.run(_tagged(client, "second"))
    assert isinstance(caught.value, stormguard.APIConnectionError)
    assert caught.value.retry_stopped_by == "not_retryable" and caught.value.attempts == 1
    stats = client.stats()
    assert all(b.failures == 0 for b in stats.breakers)
    assert all(limit.decreases == 0 and limit.in_flight == 0 for limit in stats.concurrency)
    asyncio.run(http.aclose())
