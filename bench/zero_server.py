"""A zero-latency OpenAI-compatible stub: a fixed chat completion, as fast as asyncio can.

    python bench/zero_server.py --port 8123 [--status 500 | --status 503 | --close]

Raw asyncio (no framework), HTTP/1.1 keep-alive, so the server adds as little as
possible to what bench_overhead.py measures: the clients' own time per call. Any
POST gets the same completion; ``GET /count`` the number of POSTs so far (as
``{"posts": n}``); any other request a 404. Loopback only.

For bench_outage.py it can also be a server in a full outage: ``--status N``
answers every POST with N and an OpenAI-style error body, and nothing else (no
Retry-After, no load headers: an engine failing every call, a proxy with no
healthy upstream); ``--close`` reads each POST and closes the connection
without an answer (a process that dies on every request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

#: The chat completion every POST gets, and that answer whole (the other stubs of
#: bench/ answer with it too).
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-zero",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "zero",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18},
    }
).encode()
OK = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(COMPLETION)}\r\n\r\n".encode()
    + COMPLETION
)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


def _json(status: int, body: bytes) -> bytes:
    reason = _REASONS.get(status, "OK" if status == 200 else "Error")
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _error(status: int) -> bytes:
    message = f"the stub answers every call with {status}"
    return _json(status, json.dumps({"error": {"message": message, "code": status}}).encode())


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next request on a keep-alive connection: its head and its body (framed
    by Content-Length; these stubs' clients send no other framing)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return head, await reader.readexactly(length) if length else b""


class Stub:
    """One answer for every POST (or a closed connection), and a count of them."""

    def __init__(self, status: int, close: bool) -> None:
        self.answer = OK if status == 200 else _error(status)
        self.close = close
        self.posts = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, _ = await read_request(reader)
                if head.startswith(b"POST"):
                    self.posts += 1
                    if self.close:
                        return
                    writer.write(self.answer)
                elif head.startswith(b"GET /count "):
                    writer.write(_json(200, json.dumps({"posts": self.posts}).encode()))
                else:
                    writer.write(NOT_FOUND)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.contextmanager
def in_process(command: Callable[[int], list[str]]) -> Iterator[int]:
    """Run ``command(port)`` (a stub script and its flags) on a free loopback port
    until it prints its ready line; yield the port; stop the process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, *command(port)], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        process.stdout.readline()  # "ready on ..."
        yield port
    finally:
        process.terminate()
        process.wait(timeout=5)


@contextlib.contextmanager
def running(*flags: str) -> Iterator[str]:
    """Start this stub in its own process with ``flags`` on a free loopback port;
    yield its root URL (``http://127.0.0.1:PORT``); stop it."""
    with in_process(lambda port: [str(Path(__file__)), "--port", str(port), *flags]) as port:
        yield f"http://127.0.0.1:{port}"


async def main(port: int, status: int, close: bool) -> None:
    stub = Stub(status, close)
    server = await asyncio.start_server(stub.serve, "127.0.0.1", port, backlog=1024)
    print(f"ready on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--status", type=int, default=200, help="answer every POST with this")
    parser.add_argument("--close", action="store_true", help="close every POST unanswered")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.port, args.status, args.close))
