"""A zero-latency OpenAI-compatible stub: a fixed chat completion, as fast as asyncio can.

    python bench/zero_server.py --port 8123

Raw asyncio (no framework), HTTP/1.1 keep-alive, so the server adds as little as
possible to what bench_overhead.py measures: the clients' own time per call. Any
POST gets the same completion; any other request gets a 404. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

_COMPLETION = json.dumps(
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
_OK = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(_COMPLETION)}\r\n\r\n".encode()
    + _COMPLETION
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            writer.write(_OK if head.startswith(b"POST") else _NOT_FOUND)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024)
    print(f"ready on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8123)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args().port))
