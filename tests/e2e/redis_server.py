"""A ``redis-server`` of the test's own: a free 127.0.0.1 port, nothing written to disk.

    with running_redis() as redis:
        stormguard.QuotaPolicy(redis_url=redis.url)

Started as ``redis-server --port N --bind 127.0.0.1 --save "" --appendonly no`` in a
temporary working directory; ready when it answers an inline ``PING``; ``stop()``
sends SIGTERM, then SIGKILL; ``kill()`` ends it at once (a Redis that dies mid-run).
A port taken between choosing and binding it makes redis exit: it starts again on
another. (The same shape as the quota drill's helper on its branch,
bench/stormguard_drill/redis_server.py: one of them goes when both are on main.)

``redis-server`` comes from the system (``make setup-redis``). Without it the tests
that need it skip, saying so, except where ``$STORMGUARD_REQUIRE_REDIS`` is set (CI
sets it): there they fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.server_process import free_port

__all__ = ["REQUIRE_ENV", "RedisServer", "need_redis_server", "running_redis"]

HOST = "127.0.0.1"
REQUIRE_ENV = "STORMGUARD_REQUIRE_REDIS"
_STARTS = 3


@dataclass(eq=False)
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def ping(self, timeout: float = 1.0) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=timeout) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, its connections reset."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def need_redis_server() -> str:
    """The path of ``redis-server``; skips the test without it (fails it in CI)."""
    binary = shutil.which("redis-server")
    if binary is None:
        reason = "redis-server is not on PATH (make setup-redis installs it)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason}, and ${REQUIRE_ENV} asks for the tests that need it")
        pytest.skip(reason)
    return binary


def start_redis(ready_timeout: float = 10.0, *, port: int | None = None) -> RedisServer:
    """A redis-server on ``port`` (default: a free one), answering ``PING``."""
    binary = need_redis_server()
    failures = []
    wanted = port
    for _ in range(1 if wanted is not None else _STARTS):
        workdir = Path(tempfile.mkdtemp(prefix="stormguard-redis-"))
        port = free_port() if wanted is None else wanted
        command = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly"]
        command += ["no", "--dir", str(workdir), "--daemonize", "no"]
        with (workdir / "redis.log").open("wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        server = RedisServer(port, process, workdir)
        deadline = time.monotonic() + ready_timeout
        while process.poll() is None and time.monotonic() < deadline:
            if server.ping():
                return server
            time.sleep(0.02)
        failures.append((workdir / "redis.log").read_text(errors="replace")[-800:])
        server.stop()
    raise RuntimeError("redis-server did not start:\n" + "\n".join(failures))


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()
