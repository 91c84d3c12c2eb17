"""Reference servers in subprocesses on free loopback ports, always stopped again.

Each pairing gets a fresh server, so no counter, cache or breaker carries over.
``ServerFleet`` remembers every process it started and stops them all on exit,
exceptions and Ctrl-C included (atexit is the last resort).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

_READY_TIMEOUT_S = 30.0
_STOP_GRACE_S = 5.0


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

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def stop(self) -> None:
        """SIGINT (graceful), then SIGKILL."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=_STOP_GRACE_S)


class ServerFleet:
    """Starts servers and guarantees that every one of them is stopped."""

    def __init__(self, log_dir: Path, engine_args: tuple[str, ...]) -> None:
        self._log_dir = log_dir
        self._engine_args = engine_args
        self._servers: list[ServerProcess] = []
        atexit.register(self.stop_all)

    async def start(self, name: str, *args: str) -> ServerProcess:
        """Start a server with the drill's engine flags plus ``args``; return it ready."""
        port = free_port()
        command = [sys.executable, "-m", "stormguard_server", "--port", str(port)]
        command += [*self._engine_args, *args, "--log-level", "warning"]
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / f"{name}.log"
        # Popen returns at once (no wait); the command is our own interpreter and flags.
        with log_path.open("wb") as log:
            process = subprocess.Popen(  # noqa: S603, ASYNC220
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        server = ServerProcess(name=name, port=port, process=process, log_path=log_path)
        self._servers.append(server)
        await _wait_ready(server)
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


async def _wait_ready(server: ServerProcess) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                log = server.log_path.read_text(errors="replace")
                raise RuntimeError(f"server {server.name} exited early:\n{log}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{server.root}/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise TimeoutError(f"server {server.name} not ready after {_READY_TIMEOUT_S} s")
