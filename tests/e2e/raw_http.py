"""Many plain HTTP/1.1 POSTs at once on raw asyncio connections, for floods.

An httpx client spends about 4 ms of CPU per request, twice what the server
spends answering it, so a flood of thousands measured the client more than the
server (and both share the machine). Here each request is one write of bytes
encoded once, and one read until the server closes the connection
(``Connection: close``): the server does the same work as for any client.

    responses = await post_all(server.port, "/v1/completions", body, n=2000)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["RawResponse", "post_all"]


@dataclass(frozen=True)
class RawResponse:
    status_code: int
    headers: httpx.Headers
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


def _request(port: int, path: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def _parse(raw: bytes) -> RawResponse:
    head, _, content = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = httpx.Headers([tuple(line.split(": ", 1)) for line in lines])  # type: ignore[misc]
    return RawResponse(int(status_line.split(" ", 2)[1]), headers, content)


async def _post(port: int, request: bytes, timeout: float) -> RawResponse:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        raw = await asyncio.wait_for(reader.read(), timeout)  # to EOF: Connection: close
    finally:
        writer.close()
    return _parse(raw)


async def post_all(
    port: int, path: str, body: dict[str, Any], *, n: int, timeout: float = 60.0
) -> list[RawResponse]:
    """``n`` identical POSTs sent at once, each on its own connection."""
    request = _request(port, path, body)
    return await asyncio.gather(*(_post(port, request, timeout) for _ in range(n)))
