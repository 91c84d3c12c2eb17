"""Stream timeouts: a long stream outlives the call's timeout; a late first chunk moves.

Starts two reference servers on free loopback ports: a fast one that decodes
about 40 tokens a second, and a slow one that holds every request 3 s before it
starts. Then, with ``timeout=1``:

1. an 80-token stream from the fast server, without ``StreamTimeouts``: the
   total cuts it at 1 s;
2. the same with ``StreamTimeouts(idle=0.5)``: it runs to its end, about 2 s,
   because it never waits half a second for its next chunk;
3. three streams on both servers with ``first_chunk=0.5``: an attempt that goes to
   the slow server is abandoned at 0.5 s and the call moves to the fast one.

    python examples/stream_timeouts.py
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

import stormguard
from stormguard import StreamTimeouts

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "Tell me a long story"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def reference_server(*flags: str) -> Iterator[str]:
    """A reference server with ``flags``, stopped on exit; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "stormguard_server", "--port", str(port)]
    server = subprocess.Popen([*command, "--log-level", "warning", *flags])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the reference server did not become ready")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(10)


def long_stream(client: stormguard.Client) -> str:
    started, chunks = time.monotonic(), 0
    try:
        stream = client.chat.completions.create(
            messages=MESSAGES, max_tokens=80, ignore_eos=True, stream=True
        )
        for _ in stream:
            chunks += 1
    except stormguard.APITimeoutError as exc:
        return f"cut after {chunks} chunks, {time.monotonic() - started:.1f} s: {exc}"
    return f"all {chunks} chunks in {time.monotonic() - started:.1f} s"


def main() -> None:
    with (
        reference_server("--step-base-ms", "25") as fast,
        reference_server("--added-latency-ms", "3000") as slow,
    ):
        with stormguard.Client(base_url=fast, model=MODEL, timeout=1.0) as client:
            print("1. timeout=1, no StreamTimeouts:", long_stream(client))
        idle = StreamTimeouts(idle=0.5)
        with stormguard.Client(
            base_url=fast, model=MODEL, timeout=1.0, stream_timeouts=idle
        ) as client:
            print("2. timeout=1, idle=0.5:", long_stream(client))

        names = {httpx.URL(fast).netloc.decode(): "fast", httpx.URL(slow).netloc.decode(): "slow"}
        first = StreamTimeouts(first_chunk=0.5)
        with stormguard.Client(
            base_url=[slow, fast], model=MODEL, timeout=5, stream_timeouts=first
        ) as client:
            for number in range(1, 4):
                started = time.monotonic()
                stream = client.chat.completions.create(
                    messages=MESSAGES, max_tokens=4, stream=True
                )
                text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
                path = " -> ".join(
                    f"{names[a.endpoint or '']} ({a.error_type or 'ok'})"
                    for a in stream.attempt_history
                )
                took = time.monotonic() - started
                print(f"3. call {number}: {path}, {len(text)} characters in {took:.1f} s")


if __name__ == "__main__":
    main()
