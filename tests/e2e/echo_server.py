"""A keep-alive server, in a process of its own, whose every answer says who asked.

``POST /v1/chat/completions`` answers a chat completion whose content is
``"<x-caller header>@<the client's port>"``: a test that sends a tag unique to the
call (its process id and a count) checks that the answer it reads is its own, and
learns which connection carried it. ``x-delay: <seconds>`` holds the answer back
that long; ``GET /delayed`` answers how many answers are being held back now (so a
test knows its slow calls have arrived, past their connect and TLS handshake).
``GET /ready`` answers 200. Over TLS too, with a certificate of its own
for 127.0.0.1 (:func:`self_signed`, by the ``openssl`` command).

It is uvicorn (real HTTP/1.1 keep-alive, which the client pools), started with
``python -m uvicorn`` rather than in a thread: a test that forks must not copy a
server's sockets and threads into its children. Idle connections are kept for 60 s,
longer than any test, so that a connection the client still holds is never closed
by the server during one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.server_process import free_port

__all__ = ["EchoServer", "answer_of", "run_echo_server", "self_signed"]

ROOT = Path(__file__).resolve().parents[2]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


#: Answers being held back now (``x-delay``).
_delayed = 0


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """The ASGI app (module doc)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = dict(scope["headers"])
    delay = float(headers.get(b"x-delay", b"0") or 0)
    global _delayed
    if delay:
        _delayed += 1
        try:
            await asyncio.sleep(delay)
        finally:
            _delayed -= 1
    caller = headers.get(b"x-caller", b"").decode()
    content = str(_delayed) if scope["path"] == "/delayed" else f"{caller}@{scope['client'][1]}"
    payload = json.dumps(
        {
            "id": "chatcmpl-echo",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def answer_of(content: str | None) -> tuple[str, int]:
    """The caller's tag and the client port of an answer's content."""
    assert content is not None
    tag, _, port = content.rpartition("@")
    return tag, int(port)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by ``openssl`` in ``directory``."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@dataclass
class EchoServer:
    port: int
    process: subprocess.Popen[bytes]
    scheme: str = "http"
    verify: ssl.SSLContext | bool = True

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1"

    def delayed(self) -> int:
        """How many answers the server is holding back now."""
        url = f"{self.scheme}://127.0.0.1:{self.port}/delayed"
        answer = httpx.get(url, timeout=10, verify=self.verify).json()
        return int(answer["choices"][0]["message"]["content"])


@contextlib.contextmanager
def run_echo_server(tls: tuple[Path, Path] | None = None) -> Iterator[EchoServer]:
    """Start the server on a free port (over TLS with ``tls``, a certificate and its
    key), yield it once it answers, stop it."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.e2e.echo_server:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--timeout-keep-alive",
            "60",
            "--log-level",
            "warning",
            *([] if tls is None else ["--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1])]),
        ],
        cwd=ROOT,
        env=env,
    )
    verify = True if tls is None else ssl.create_default_context(cafile=str(tls[0]))
    server = EchoServer(port, process, "http" if tls is None else "https", verify)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError("the echo server exited at start")
            with contextlib.suppress(httpx.HTTPError):
                ready = f"{server.scheme}://127.0.0.1:{port}/ready"
                if httpx.get(ready, timeout=2, verify=verify).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the echo server did not answer within 30 s")
            time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
