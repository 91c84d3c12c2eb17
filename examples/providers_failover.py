"""Two providers behind one client: failover while the primary is degraded, and back.

Starts two reference servers on free loopback ports, standing for two providers of
one model: the primary serves it as ``gpt-4.1`` (OpenAI's name), the secondary as
``prod-gpt41`` (an Azure OpenAI deployment's). One client has both as
``stormguard.Deployment``s of the logical model ``chat-large``, each with its own
key: the primary of tier 1, the secondary of tier 2. Every call asks for
``chat-large`` and streams, with a first-chunk bound of 0.5 s.

1. Healthy: every call is served by the primary.
2. The primary degrades, as in the incident (its fault admin endpoint: 30 % of its
   requests fail with a 500, the rest wait 2 s before their first token, past the
   bound): each call still succeeds, on the secondary; after five failures in a row
   the primary leaves rotation and calls go to the secondary at once.
3. The primary recovers (its faults cleared): once its ejection ends, calls return to
   it gradually. Each round opens six streams before reading them: the primary takes
   one at first (its concurrency limit starts again from its floor), then two, four,
   and soon all six, while the secondary takes the rest.

    python examples/providers_failover.py
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

import stormguard
from stormguard import Deployment, EjectionConfig, StreamTimeouts

MESSAGES = [{"role": "user", "content": "Summarize the incident report in one line."}]
ROUND = 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ReferenceServer:
    """A reference server serving ``model``, with its fault admin endpoint."""

    def __init__(self, model: str) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.token = secrets.token_urlsafe(24)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        command = [
            sys.executable, "-m", "stormguard_server", "--port", str(self.port),
            "--model", model, "--admin-port", str(self.admin_port),
            "--log-level", "warning",
        ]  # fmt: skip
        # The token goes in the environment: argv shows in ps (and a token starting
        # with "-" would read as a flag there).
        environment = {**os.environ, "STORMGUARD_ADMIN_TOKEN": self.token}
        self.process = subprocess.Popen(command, env=environment)

    def wait_ready(self) -> None:
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=1).status_code == 200:
                    return
            if time.monotonic() - started > 30:
                raise SystemExit("the reference server did not become ready in 30 s")
            time.sleep(0.1)

    def faults(self, **faults: Any) -> None:
        response = httpx.post(
            f"http://127.0.0.1:{self.admin_port}/admin/faults",
            json=faults,
            headers={"authorization": f"Bearer {self.token}"},
            timeout=5,
        )
        response.raise_for_status()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@contextlib.contextmanager
def two_providers() -> Iterator[tuple[ReferenceServer, ReferenceServer]]:
    servers = [ReferenceServer("gpt-4.1"), ReferenceServer("prod-gpt41")]
    try:
        for server in servers:
            server.wait_ready()
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


def one_call(client: stormguard.Client) -> str:
    """One streamed call: where its attempts went, and the model that answered."""
    stream = client.chat.completions.create(messages=MESSAGES, max_tokens=8, stream=True)
    models = {chunk.model for chunk in stream}
    path = " -> ".join(
        f"{a.deployment} ({a.error_type or a.outcome})" for a in stream.attempt_history
    )
    return f"{path}; answered by model {', '.join(sorted(models))}"


def one_round(client: stormguard.Client) -> list[str]:
    """``ROUND`` streams opened before any is read (each holds its slot until read):
    the deployment each went to."""
    streams = [
        client.chat.completions.create(messages=MESSAGES, max_tokens=4, stream=True)
        for _ in range(ROUND)
    ]
    served = [stream.call_info.deployment or "" for stream in streams]
    for stream in streams:
        for _ in stream:
            pass
    return served


class TierLines(logging.Handler):
    """Prints stormguard's log lines about tiers (left, back in rotation)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("tier "):
            print(f"   log: {message}")


def main() -> None:
    logger = logging.getLogger("stormguard")
    logger.setLevel(logging.INFO)
    logger.addHandler(TierLines())
    with two_providers() as (primary, secondary):
        client = stormguard.Client(
            base_url=[
                Deployment(
                    primary.base_url,
                    name="primary",
                    tier=1,
                    models={"chat-large": "gpt-4.1"},
                    api_key="sk-primary-example-0123456789",
                ),
                Deployment(
                    secondary.base_url,
                    name="secondary",
                    tier=2,
                    models={"chat-large": "prod-gpt41"},
                    api_key="secondary-example-0123456789",
                    api_key_header="api-key",
                    query={"api-version": "2024-10-21"},
                ),
            ],
            model="chat-large",
            timeout=10,
            stream_timeouts=StreamTimeouts(first_chunk=0.5),
            # Shorter than the default 10 s, so the example does not wait long.
            ejection=EjectionConfig(base_ejection_time=3.0),
        )
        with client:
            for number in range(1, 4):
                print(f"1. call {number}: {one_call(client)}")

            primary.faults(error_rate=0.3, added_latency_ms=2000)
            for number in range(1, 9):
                print(f"2. call {number}: {one_call(client)}")
            print(f"2. tiers left: {client.stats().tiers_left}")

            primary.faults(error_rate=0.0, added_latency_ms=0)
            started = time.monotonic()
            rounds = 0
            while time.monotonic() - started < 30:
                served = one_round(client)
                if "primary" in served:
                    rounds += 1
                    counts = {name: served.count(name) for name in ("primary", "secondary")}
                    took = time.monotonic() - started
                    print(
                        f"3. round {rounds} at {took:.1f} s: primary {counts['primary']},"
                        f" secondary {counts['secondary']}"
                    )
                    if counts["primary"] == ROUND:
                        break
                else:
                    time.sleep(0.25)
            stats = client.stats()
            print(f"3. tiers left: {stats.tiers_left}")
            for deployment in stats.deployments:
                print(
                    f"   {deployment.deployment} (tier {deployment.tier}):"
                    f" {deployment.attempts} attempts, {deployment.served} served,"
                    f" {deployment.failovers} failed over"
                )


if __name__ == "__main__":
    main()
