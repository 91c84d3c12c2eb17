"""Hedged streams: a slow replica no longer sets the time to the first token.

Starts two reference servers on free loopback ports, standing for two vLLM
replicas of one model; one of them is slow (it holds each request 5 s before its
engine takes it, as a long prefill ahead in its batch would).

1. ``hedge=None`` (the default): six streams at once, spread over both replicas by
   load; those on the slow replica wait 5 s for their first chunk.
2. ``hedge=HedgePolicy(delay=0.3)``: the same six; a stream with no chunk after
   0.3 s sends one hedge to the other replica, the first chunk wins, and the slow
   replica's request is cancelled (its connection closed: the server aborts it).
   A production client would leave ``delay`` to the p95 of recent latencies and
   the budget at 5 % of calls; the demo hedges every slow stream.

    python examples/hedged_stream.py
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

import stormguard
from stormguard import Endpoint, HedgePolicy

MODEL = "stormguard-sim"
STREAMS = 6
SLOW_MS = 5000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Replica:
    """A reference server on a free loopback port."""

    def __init__(self, name: str, *flags: str) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        command = [
            sys.executable, "-m", "stormguard_server", "--port", str(self.port),
            "--model", MODEL, "--log-level", "warning", *flags,
        ]  # fmt: skip
        self.process = subprocess.Popen(command)

    def wait_ready(self) -> None:
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=1).status_code == 200:
                    return
            if time.monotonic() - started > 30:
                raise SystemExit(f"{self.name} did not become ready in 30 s")
            time.sleep(0.1)

    def clients_gone(self) -> int:
        """The server's count of requests whose client left before the answer."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        return int(
            sum(
                float(line.rpartition(" ")[2])
                for line in text.splitlines()
                if line.startswith("stormguard_client_disconnects_total")
            )
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextlib.contextmanager
def two_replicas() -> Iterator[tuple[Replica, Replica]]:
    slow = Replica("replica-slow", "--added-latency-ms", str(SLOW_MS))
    fast = Replica("replica-fast")
    try:
        slow.wait_ready()
        fast.wait_ready()
        yield slow, fast
    finally:
        slow.stop()
        fast.stop()


async def one_stream(client: stormguard.AsyncClient, n: int) -> tuple[float, str, bool]:
    """One stream: its time to the first chunk, the replica that answered, hedged or not."""
    started = time.monotonic()
    stream = await client.chat.completions.create(
        messages=[{"role": "user", "content": f"Tell me a story, number {n}."}],
        max_tokens=16,
        stream=True,
    )
    first = time.monotonic() - started  # the call returns at the stream's first chunk
    async with stream:
        async for _ in stream:
            pass
    winner = next(r for r in stream.attempt_history if r.outcome == "ok")
    hedged = any(r.hedge for r in stream.attempt_history)
    return first, winner.endpoint or "?", hedged


async def run(replicas: tuple[Replica, Replica], part: int, hedge: HedgePolicy | None) -> None:
    slow, fast = replicas
    async with stormguard.AsyncClient(
        base_url=[Endpoint(slow.base_url, name=slow.name), Endpoint(fast.base_url, name=fast.name)],
        model=MODEL,
        timeout=30,
        hedge=hedge,
    ) as client:
        results = await asyncio.gather(*(one_stream(client, n) for n in range(STREAMS)))
        for n, (first, replica, hedged) in enumerate(results):
            note = " (hedged)" if hedged else ""
            print(f"{part}. stream {n}: first chunk after {first:.2f} s from {replica}{note}")
        print(f"{part}. slowest first chunk: {max(first for first, _, _ in results):.2f} s")
        stats = client.stats()
        print(f"{part}. hedges sent {stats.hedges_sent}, won {stats.hedges_won}")


def main() -> None:
    with two_replicas() as replicas:
        slow = replicas[0]
        print(f"1. hedge=None: {STREAMS} streams, one replica holds each request {SLOW_MS} ms")
        asyncio.run(run(replicas, 1, None))
        gone = slow.clients_gone()
        print(f"2. hedge=HedgePolicy(delay=0.3): the same {STREAMS} streams")
        asyncio.run(run(replicas, 2, HedgePolicy(delay=0.3, budget=1.0)))
        for _ in range(50):  # the server counts a client gone once it notices
            if slow.clients_gone() > gone:
                break
            time.sleep(0.1)
        print(f"2. the slow replica saw {slow.clients_gone() - gone} clients leave (aborted)")


if __name__ == "__main__":
    main()
