"""Reference servers in subprocesses on free loopback ports, always stopped again.

Each pairing gets a fresh server, so no counter, cache or breaker carries over.
``ServerFleet`` remembers every process it started and stops them all on exit,
exceptions and Ctrl-C included (atexit is the last resort).

An :class:`EngineSpec` says how one engine's servers start and stop. The sim
server is one process, ready at ``/ready`` within a second. ``--engine vllm``
spawns an engine-core process beside the API server and takes ~20 s to
``/health``: it runs in its own session, and stopping it signals the whole
process group (SIGINT, then SIGKILL), so no engine core outlives the drill.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from stormguard_server.guards.admin_guard import ADMIN_TOKEN_ENV
from stormguard_server.http.port_file import read_port_file


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """How the servers of one engine are started, found ready and stopped."""

    args: tuple[str, ...]  # engine flags of every server
    ready_path: str = "/ready"
    ready_timeout_s: float = 30.0
    stop_grace_s: float = 5.0
    own_session: bool = False  # True: a process group of its own, signalled as a whole
    # Sent once when ready, before the pairing's clock starts (POST /v1/chat/completions):
    # the sim's /ready follows its own warm-up probe, vLLM's /health does not.
    warmup_request: dict[str, Any] | None = None
    # The sim binds port 0 and says which it got (``--port-file``): no other process can
    # take a port between our choosing it and its binding it. vLLM serves HTTP itself and
    # has no such flag: it gets a port free a moment before.
    reports_ports: bool = True
    # The variable naming where the engine puts its IPC sockets, if it has any: vLLM's
    # engine core and API server talk over ZMQ sockets in $VLLM_RPC_BASE_PATH (the temp
    # directory by default) and leave them there when killed. Each server gets a
    # directory of its own, removed when it stops.
    ipc_env: str | None = None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    """One running ``python -m stormguard_server``."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    spec: EngineSpec
    admin_port: int | None = None  # the sim's admin endpoint (``--admin-port``), if on
    admin_token: str | None = field(default=None, repr=False)  # its bearer token
    # Where it writes the ports it bound, once listening (port 0 asked for: port and
    # admin_port are 0 until read from it).
    port_file: Path | None = None
    ipc_dir: Path | None = None  # its engine's IPC sockets (EngineSpec.ipc_env), if any

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin_url(self, path: str) -> str:
        if self.admin_port is None:
            raise RuntimeError(f"server {self.name} was started without its admin endpoint")
        return f"http://127.0.0.1:{self.admin_port}{path}"

    @property
    def admin_headers(self) -> dict[str, str]:
        """The admin endpoint's Authorization header (send JSON bodies: ``json={}``)."""
        if self.admin_token is None:
            raise RuntimeError(f"server {self.name} was started without its admin endpoint")
        return {"authorization": f"Bearer {self.admin_token}"}

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def stop(self) -> None:
        """SIGINT (graceful), then SIGKILL; to the whole group when it has its own."""
        grace = self.spec.stop_grace_s
        if self.process.poll() is None:
            self._signal(signal.SIGINT)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=grace)
        if self.spec.own_session:
            # Children (vLLM's engine core) may outlive the leader: none may stay.
            self._signal(signal.SIGKILL)
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def _signal(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.spec.own_session:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)


class ServerFleet:
    """Starts servers and guarantees that every one of them is stopped."""

    def __init__(self, log_dir: Path, spec: EngineSpec) -> None:
        self._log_dir = log_dir
        self._spec = spec
        self._servers: list[ServerProcess] = []
        atexit.register(self.stop_all)

    async def start(
        self, name: str, *args: str, admin: bool = False, port: int | None = None
    ) -> ServerProcess:
        """Start a server with the drill's engine flags plus ``args``; return it ready.
        ``admin``: with the admin endpoint (faults, ``POST /admin/crash``) on another
        free loopback port, behind a token of our own (in the environment, not argv).
        ``port``: this one (a replica restarted where it was) instead of a free one."""
        reports = self._spec.reports_ports
        if port is None:
            port = 0 if reports else free_port()
        admin_port = (0 if reports else free_port()) if admin else None
        while admin_port == port != 0:  # both were free, then closed again: not the same one
            admin_port = free_port()
        admin_token = secrets.token_urlsafe(32) if admin else None
        command = [sys.executable, "-m", "stormguard_server", "--port", str(port)]
        command += [*self._spec.args, *args, "--log-level", "warning"]
        if admin_port is not None:
            command += ["--admin-port", str(admin_port)]
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / f"{name}.log"
        port_file = self._log_dir / f"{name}.ports.json" if reports else None
        if port_file is not None:
            port_file.unlink(missing_ok=True)  # an earlier run's
            command += ["--port-file", str(port_file)]
        env = _environment(admin_token)
        ipc_dir = ipc_directory(self._spec, env, name)
        # Popen returns at once (no wait); the command is our own interpreter and flags.
        with log_path.open("wb") as log:
            process = subprocess.Popen(  # noqa: S603, ASYNC220
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=self._spec.own_session,
            )
        server = ServerProcess(
            name=name,
            port=port,
            process=process,
            log_path=log_path,
            spec=self._spec,
            admin_port=admin_port,
            admin_token=admin_token,
            port_file=port_file,
            ipc_dir=ipc_dir,
        )
        self._servers.append(server)
        try:
            await _wait_ready(server)
        except BaseException:
            self.stop(server)
            raise
        return server

    def stop(self, server: ServerProcess) -> None:
        server.stop()
        if server in self._servers:
            self._servers.remove(server)

    def stop_all(self) -> None:
        while self._servers:
            self._servers.pop().stop()

    async def __aenter__(self) -> ServerFleet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()


def ipc_directory(spec: EngineSpec, env: dict[str, str], name: str) -> Path | None:
    """A new directory for the engine's IPC sockets, named in ``env``; None without any."""
    if spec.ipc_env is None:
        return None
    directory = Path(tempfile.mkdtemp(prefix=f"{name}-ipc-"))
    env[spec.ipc_env] = str(directory)
    return directory


def _environment(admin_token: str | None) -> dict[str, str]:
    """Ours, unbuffered, with the admin token when there is one (and never an inherited one)."""
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if admin_token is not None:
        env[ADMIN_TOKEN_ENV] = admin_token
    return env


async def _wait_ready(server: ServerProcess) -> None:
    timeout = server.spec.ready_timeout_s
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                log = server.log_path.read_text(errors="replace")[-6000:]
                raise RuntimeError(f"server {server.name} exited early:\n{log}")
            if not _read_ports(server):
                await asyncio.sleep(0.05)
                continue
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{server.root}{server.spec.ready_path}")).status_code == 200:
                    await _warm_up(server, http)
                    return
            await asyncio.sleep(0.05 if timeout <= 30 else 0.5)
    raise TimeoutError(f"server {server.name} not ready after {timeout} s")


def _read_ports(server: ServerProcess) -> bool:
    """Whether the server listens on its ports, as its port file says once written;
    without one, assumed."""
    if server.port_file is None:
        return True
    ports = read_port_file(server.port_file)
    if ports is None:
        return False
    server.port, server.admin_port = ports
    return True


async def _warm_up(server: ServerProcess, http: httpx.AsyncClient) -> None:
    body = server.spec.warmup_request
    if body is not None:
        response = await http.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
        response.raise_for_status()
