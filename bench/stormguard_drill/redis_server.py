"""A ``redis-server`` of our own: a free 127.0.0.1 port, nothing written to disk, stopped after.

The quota drill runs LiteLLM's Router with its Redis settings against one, and tests
that need a real Redis start one the same way::

    with running_redis() as redis:
        client = redis_py.Redis(host=redis.host, port=redis.port)

It is started as ``redis-server --port N --bind 127.0.0.1 --save "" --appendonly no``
(no snapshot, no append-only file) in a temporary working directory, so that even a
``SAVE`` sent to it writes nothing into the checkout; it is ready when it answers
``PING``. A port taken between choosing it and binding it makes the server exit at
once: it is started again on another port. ``stop()`` sends SIGTERM, then SIGKILL, and
an ``atexit`` hook stops any server still running when the interpreter exits;
``kill()`` ends it at once (a Redis that dies mid-run), and ``start_redis(port=...)``
starts one again where its clients look for it.

Nothing here imports the ``redis`` package: readiness is one inline ``PING`` on a
socket, so the helper also serves code that talks to Redis through another client.
``redis-server`` comes from the system (``make setup-redis``); where it is missing,
``RedisUnavailable`` says so.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stormguard_drill.servers import free_port

__all__ = ["RedisServer", "RedisUnavailable", "running_redis", "start_redis"]

HOST = "127.0.0.1"
_STARTS = 3  # tries, each on a fresh port (a port taken meanwhile makes redis exit)
_STOP_GRACE_S = 5.0
_RUNNING: set[RedisServer] = set()


class RedisUnavailable(RuntimeError):
    """``redis-server`` is not installed, or did not come up; the message says which."""


@dataclass(eq=False)
class RedisServer:
    """One running ``redis-server``."""

    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    _owns_workdir: bool = field(default=True, repr=False)

    host: str = HOST

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server answers an inline ``PING`` with ``+PONG``."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: the server is gone at once and its connections reset, as a Redis that
        dies mid-run (its working directory stays until ``stop()``)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=_STOP_GRACE_S)

    def stop(self) -> None:
        """SIGTERM (redis exits without saving: no save points), then SIGKILL."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=_STOP_GRACE_S)
        _RUNNING.discard(self)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable(
            "redis-server is not on PATH: `make setup-redis` installs it (apt-get install"
            " redis-server)"
        )
    return binary


def start_redis(
    *, ready_timeout_s: float = 10.0, log_path: Path | None = None, port: int | None = None
) -> RedisServer:
    """A ``redis-server`` on a free loopback port (or on ``port``: one try, as a server
    started again where its clients look for it), answering ``PING``; stop it with
    ``stop()`` (or use ``running_redis()``). Its log goes to ``log_path`` (default: its
    temporary working directory, removed on stop)."""
    binary = _binary()
    failures: list[str] = []
    for _ in range(_STARTS if port is None else 1):
        workdir = Path(tempfile.mkdtemp(prefix="stormguard-redis-"))
        log = log_path or workdir / "redis.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        chosen = free_port() if port is None else port
        command = [
            binary,
            "--port",
            str(chosen),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--daemonize",
            "no",
        ]
        with log.open("wb") as out:
            # Our own fixed command line (no shell), the system's redis-server.
            process = subprocess.Popen(  # noqa: S603
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        server = RedisServer(port=chosen, process=process, workdir=workdir, log_path=log)
        _RUNNING.add(server)
        deadline = time.monotonic() + ready_timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            if server.ping():
                return server
            time.sleep(0.02)
        exited = process.poll()
        tail = log.read_text(errors="replace")[-1500:]  # before stop() removes the directory
        server.stop()
        if exited is None:
            failures.append(f"not answering PING after {ready_timeout_s} s:\n{tail}")
            break  # a server that runs but does not answer will not on another port
        failures.append(f"exited ({exited}) on port {chosen}:\n{tail}")
    raise RedisUnavailable("redis-server did not start: " + "\n".join(failures))


@contextlib.contextmanager
def running_redis(*, log_path: Path | None = None) -> Iterator[RedisServer]:
    """``start_redis()`` for the length of a ``with`` block, stopped on the way out."""
    server = start_redis(log_path=log_path)
    try:
        yield server
    finally:
        server.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()
