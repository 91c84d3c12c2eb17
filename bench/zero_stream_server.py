"""A zero-latency OpenAI-compatible stub that streams chat completion chunks over SSE.

    python bench/zero_stream_server.py --port 8124

Raw asyncio (no framework), HTTP/1.1 keep-alive, chunked transfer encoding with one
HTTP chunk per SSE event, as vLLM's and FastAPI's streaming responses send them.
Any POST gets ``max_tokens`` chunks (one token each; the first carries the role,
the last the finish reason), then ``data: [DONE]``; the bytes of each length are
built once, so the server's own cost stays small beside the client's. A POST for
the model ``bulk`` gets the same events in HTTP chunks of 64 KiB, each cut
wherever the 64 KiB fall (mid-event, mid-line): what a buffering proxy in front
of the engine sends (nginx with ``proxy_buffering on`` passes the upstream's
bytes on a buffer at a time, whatever the event boundaries), and what a replay
or an engine faster than the network delivers, many events per read. A POST
for the model ``hold`` gets its first chunk and then nothing until the client
closes the connection: an open stream, for measuring the client's memory per
stream. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from zero_server import NOT_FOUND, in_process, read_request

#: The HTTP chunk of a ``bulk`` stream: a buffering proxy's buffer.
BULK_CHUNK = 1 << 16
_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(index: int, last: bool) -> dict[str, object]:
    delta: dict[str, str] = {"content": f" tok{index}"}
    if index == 0:
        delta["role"] = "assistant"
    return {
        "id": "chatcmpl-zero",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "zero",
        "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if last else None}],
    }


def _http_chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@cache
def stream_bytes(chunks: int, bulk: bool = False) -> bytes:
    """The whole answer of a stream of ``chunks`` chunks, head to last empty HTTP
    chunk: one HTTP chunk per event, or (``bulk``) the events cut in 64 KiB chunks."""
    events = [_event(_chunk(i, i == chunks - 1)) for i in range(chunks)]
    events.append(b"data: [DONE]\n\n")
    if bulk:
        body = b"".join(events)
        events = [body[at : at + BULK_CHUNK] for at in range(0, len(body), BULK_CHUNK)]
    return _HEAD + b"".join(_http_chunk(e) for e in events) + b"0\r\n\r\n"


def _first_only() -> bytes:
    return _HEAD + _http_chunk(_event(_chunk(0, False)))


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head, body = await read_request(reader)
            if not head.startswith(b"POST"):
                writer.write(NOT_FOUND)
                await writer.drain()
                continue
            request = json.loads(body or b"{}")
            if request.get("model") == "hold":
                writer.write(_first_only())
                await writer.drain()
                await reader.read()  # until the client closes the stream
                return
            chunks = int(request.get("max_tokens") or 16)
            writer.write(stream_bytes(chunks, bulk=request.get("model") == "bulk"))
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


@contextlib.contextmanager
def running() -> Iterator[str]:
    """Start this stub in its own process on a free loopback port; yield its /v1
    base URL; stop it."""
    with in_process(lambda port: [str(Path(__file__)), "--port", str(port)]) as port:
        yield f"http://127.0.0.1:{port}/v1"


async def main(port: int) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=1024)
    print(f"ready on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8124)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.port))
