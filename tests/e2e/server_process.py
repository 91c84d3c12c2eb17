"""Run the real ``stormguard-server`` in a subprocess on a free loopback port.

Reusable by any e2e test (the SDK's too):

    with run_server("--max-queue-requests", "4") as server:
        httpx.get(server.url("/v1/models"))

    with run_servers(spec("--admission", "off"), spec(admin=True)) as (off, on):
        ...  # started side by side: two start-ups take little more than one

``server.base_url`` ends in ``/v1`` (what openai/stormguard clients take);
``server.metrics()`` parses /metrics; ``server.rss_bytes()`` reads the
process's resident memory. A server started with ``admin=True`` has its admin
endpoint on another free port, guarded by a token of the test's own (given in
``$STORMGUARD_ADMIN_TOKEN``): ``server.admin_get(path)`` and
``server.admin_post(path, body)`` send it (``admin_headers`` holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from stormguard_server.guards.admin_guard import ADMIN_TOKEN_ENV
from stormguard_server.http.port_file import read_port_file

# Small, fast engine for tests: 2048-token KV cache, quick steps, 1 s cold restart.
FAST_ENGINE_ARGS = (
    "--num-kv-blocks",
    "128",
    "--block-size",
    "16",
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "16",
    "--max-num-batched-tokens",
    "512",
    "--step-base-ms",
    "2",
    "--restart-s",
    "1",
    "--slow-start-s",
    "0.5",
)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningServer:
    """A server process; its ports are read from its port file by ``wait_ready`` (it
    binds port 0 unless asked for one, so no other process can take it meanwhile)."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port_file: Path
    port: int = 0
    admin_port: int | None = None
    admin_token: str | None = field(default=None, repr=False)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    def admin_url(self, path: str) -> str:
        assert self.admin_port is not None, "start the server with admin=True"
        return f"http://127.0.0.1:{self.admin_port}{path}"

    @property
    def admin_headers(self) -> dict[str, str]:
        assert self.admin_token is not None, "start the server with admin=True"
        return {"authorization": f"Bearer {self.admin_token}"}

    def admin_get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        """An authorized GET of the admin endpoint."""
        return httpx.get(self.admin_url(path), headers=self.admin_headers, timeout=timeout)

    def admin_post(
        self, path: str, body: Mapping[str, object] | None = None, timeout: float = 10.0
    ) -> httpx.Response:
        """An authorized JSON POST to the admin endpoint (``{}`` when no body is given)."""
        return httpx.post(
            self.admin_url(path), json=body or {}, headers=self.admin_headers, timeout=timeout
        )

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics as ``{'name{labels}': value}``."""
        text = httpx.get(self.url("/metrics"), timeout=10).text
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def metric(self, name: str) -> float:
        """One sample (0 when absent, e.g. a labelled counter never incremented)."""
        return self.metrics().get(name, 0.0)

    def rss_bytes(self) -> int:
        """Resident memory of the server process."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> float:
        """Block until /ready is 200; returns the seconds it took."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            if not self.read_ports():
                time.sleep(0.05)
                continue
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url("/ready"), timeout=2).status_code == 200:
                    return time.monotonic() - start
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def read_ports(self) -> bool:
        """Whether it listens, as its port file says once written."""
        ports = read_port_file(self.port_file)
        if ports is None:
            return False
        self.port, self.admin_port = ports
        return True


class HasMetric(Protocol):
    def metric(self, name: str) -> float: ...


async def wait_for_metric(
    server: HasMetric, name: str, done: Callable[[float], bool], timeout: float = 5.0
) -> float:
    """Poll ``server.metric(name)`` until ``done(value)``; its value then.

    A condition, not a sleep: on a loaded machine it just takes longer. The timeout
    only bounds a test whose condition never comes true: it fails it, naming both."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(server.metric, name)
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} still {value} after {timeout} s")
        await asyncio.sleep(0.02)


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server: ``run_server``'s arguments, for ``run_servers``."""

    args: tuple[str, ...] = ()
    admin: bool = False
    fast: bool = True
    port: int | None = None


def spec(*args: str, admin: bool = False, fast: bool = True, port: int | None = None) -> ServerSpec:
    """``ServerSpec(args, ...)`` written as ``run_server``'s call is."""
    return ServerSpec(args, admin=admin, fast=fast, port=port)


@contextlib.contextmanager
def run_server(
    *args: str, admin: bool = False, fast: bool = True, port: int | None = None
) -> Iterator[RunningServer]:
    """Start the server with ``args`` (after the fast test sizes), on ``port`` or a free
    one, yield it ready, stop it."""
    with run_servers(spec(*args, admin=admin, fast=fast, port=port)) as (server,):
        yield server


@contextlib.contextmanager
def run_servers(*specs: ServerSpec) -> Iterator[list[RunningServer]]:
    """Start one server per spec, all at once (their start-ups overlap: most of one is
    importing the app), yield them ready, and stop them all at once."""
    servers: list[RunningServer] = []
    try:
        for one in specs:
            servers.append(launch_server(one))
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        stop_servers(servers)
        remove_logs(servers)


def launch_server(spec: ServerSpec) -> RunningServer:
    """Start a server process (not yet ready: see ``RunningServer.wait_ready``)."""
    admin_token = secrets.token_urlsafe(32) if spec.admin else None
    command = [sys.executable, "-m", "stormguard_server", "--port", str(spec.port or 0)]
    if spec.fast:
        command += FAST_ENGINE_ARGS
    if spec.admin:
        command += ["--admin-port", "0"]
    with tempfile.NamedTemporaryFile(prefix="stormguard-server-", suffix=".log", delete=False) as f:
        log_path = Path(f.name)
    port_file = log_path.with_suffix(".ports.json")
    command += ["--port-file", str(port_file), *spec.args]
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if admin_token is not None:
        env[ADMIN_TOKEN_ENV] = admin_token  # not in argv, as scripts should
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    return RunningServer(
        process=process, log_path=log_path, port_file=port_file, admin_token=admin_token
    )


def stop_server(server: RunningServer) -> None:
    """SIGINT (graceful), then SIGKILL after a few seconds."""
    stop_servers([server])


def stop_servers(servers: list[RunningServer]) -> None:
    """SIGINT to each (graceful, all at once), then SIGKILL to any still running after a
    few seconds."""
    for server in servers:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGINT)
    for server in servers:
        try:
            server.process.wait(timeout=8)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=5)


def remove_logs(servers: list[RunningServer]) -> None:
    for server in servers:
        for path in (server.log_path, server.port_file):
            with contextlib.suppress(OSError):
                path.unlink()
