"""DNS discovery end to end: two real reference servers on the same port of two
loopback addresses (127.0.0.1 and 127.0.0.2, as two pods behind a headless
service), and a stub resolver that maps one name to both, as the A records would.
Calls spread over both; when one replica goes away and the name drops it, calls
keep succeeding and the client's set follows."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import stormguard
from stormguard import DiscoveryConfig
from tests.e2e.server_process import FAST_ENGINE_ARGS, RunningServer, remove_logs, stop_server

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "ping"}]
HOSTS = ("127.0.0.1", "127.0.0.2")


def port_free_on_both() -> int:
    """A port free on 127.0.0.1 and on 127.0.0.2 (Linux routes all of 127/8 to lo)."""
    for _ in range(20):
        with socket.socket() as first:
            first.bind((HOSTS[0], 0))
            port: int = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind((HOSTS[1], port))
                except OSError:
                    continue
        return port
    raise RuntimeError("no port free on both loopback addresses")


@contextlib.contextmanager
def server_on(host: str, port: int) -> Iterator[RunningServer]:
    command = [sys.executable, "-m", "stormguard_server", "--host", host, "--port", str(port)]
    with tempfile.NamedTemporaryFile(prefix="stormguard-dns-", suffix=".log", delete=False) as f:
        log_path = Path(f.name)
    port_file = log_path.with_suffix(".ports.json")
    command += ["--port-file", str(port_file), *FAST_ENGINE_ARGS]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = RunningServer(process=process, log_path=log_path, port_file=port_file, port=port)
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{server.log()}")
            # Ours listens (not another process on the port it was given), then is ready.
            with contextlib.suppress(httpx.HTTPError):
                url = f"http://{host}:{port}/ready"
                if server.read_ports() and httpx.get(url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {host}:{port} not ready:\n{server.log()}")
            time.sleep(0.05)
        yield server
    finally:
        stop_server(server)
        remove_logs([server])


@pytest.fixture
def replicas() -> Iterator[tuple[int, list[RunningServer]]]:
    port = port_free_on_both()
    with server_on(HOSTS[0], port) as first, server_on(HOSTS[1], port) as second:
        yield port, [first, second]


class Records:
    """The stub's A records: what the name resolves to now."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.looks = 0

    def __call__(self, host: str, port: int) -> list[str]:
        assert host == "vllm.test"
        self.looks += 1
        return list(self.addresses)


async def test_calls_spread_over_every_address_and_follow_the_name(
    replicas: tuple[int, list[RunningServer]],
) -> None:
    port, (_, second) = replicas
    records = Records(*HOSTS)
    names = {f"{host}:{port}" for host in HOSTS}
    config = DiscoveryConfig(resolver=records, refresh_interval=30.0, min_refresh_interval=0.2)
    base_url = f"dns+http://vllm.test:{port}/v1"
    with stormguard.Client(base_url=base_url, model=MODEL, timeout=10, discovery=config) as sync:
        seen = {
            sync.chat.completions.create(messages=MESSAGES, max_tokens=4)
            .attempt_history[-1]
            .endpoint
            for _ in range(30)
        }
        assert seen == names
        async with stormguard.AsyncClient(
            base_url=base_url, model=MODEL, timeout=10, discovery=config
        ) as async_client:
            results = await asyncio.gather(
                *(
                    async_client.chat.completions.create(messages=MESSAGES, max_tokens=4)
                    for _ in range(30)
                )
            )
            assert {r.attempt_history[-1].endpoint for r in results} == names

        # The second replica goes away, and the name no longer lists it.
        stop_server(second)
        records.addresses = [HOSTS[0]]
        bound = time.monotonic() + 15  # only a name that never drops it fails this
        while set(sync.stats().endpoint_names) != {f"{HOSTS[0]}:{port}"}:
            assert time.monotonic() < bound, sync.stats().discovery
            resp = sync.chat.completions.create(
                messages=MESSAGES, max_tokens=4
            )  # each one succeeds
            assert resp.attempt_history[-1].endpoint == f"{HOSTS[0]}:{port}"
        [state] = sync.stats().discovery
        assert state.endpoints == (f"{HOSTS[0]}:{port}",) and state.failures == 0
