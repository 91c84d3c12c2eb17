"""openai-python with stormguard's protection: the httpx transport.

Starts a reference server on a free loopback port, then calls it with the real
``openai`` package through ``stormguard.httpx_client`` (openai's ``max_retries`` as
it is: the transport answers each call as final, so its retries never stack on
stormguard's budgeted ones). Prints the answer, what the transport did, and a shed
request as openai-python sees it.

    python examples/openai_transport.py
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import openai

import stormguard


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "stormguard_server", "--port", str(port), "--log-level", "warning"]
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.terminate()
    raise SystemExit("the reference server did not become ready")


def main() -> None:
    port = free_port()
    server = start_server(port)
    base_url = f"http://127.0.0.1:{port}/v1"
    http_client = stormguard.httpx_client(base_url=base_url, timeout=30)
    client = openai.OpenAI(base_url=base_url, api_key="unused", http_client=http_client)
    try:
        resp = client.chat.completions.create(
            model="stormguard-sim",
            messages=[{"role": "user", "content": "Say hello"}],
            max_tokens=12,
        )
        print("answer:", resp.choices[0].message.content)
        stream = client.chat.completions.create(
            model="stormguard-sim",
            messages=[{"role": "user", "content": "Count to three"}],
            max_tokens=8,
            stream=True,
        )
        print("stream:", "".join(chunk.choices[0].delta.content or "" for chunk in stream))
        try:
            client.chat.completions.create(
                model="stormguard-sim",
                messages=[{"role": "user", "content": "way too long " * 2000}],
                max_tokens=10,
            )
        except openai.BadRequestError as exc:
            print("refused:", exc.status_code, exc.response.headers.get("x-load-shed"))
        stats = http_client._transport.client.stats()  # type: ignore[attr-defined]
        print(
            f"stormguard: {stats.logical_calls} calls, {stats.attempts} attempts,"
            f" amplification {stats.retry_amplification:.2f}"
        )
    finally:
        http_client.close()
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
