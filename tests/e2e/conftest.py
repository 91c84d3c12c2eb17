"""Fixtures that start the real reference server (see server_process.py), and a
``redis-server`` of the test's own (the drill's helper, bench/stormguard_drill/redis_server.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from stormguard_drill.redis_server import RedisServer, start_redis
from tests.e2e.server_process import (
    RunningServer,
    ServerSpec,
    launch_server,
    remove_logs,
    run_server,
    spec,
    stop_servers,
)

__all__ = ["REQUIRE_REDIS_ENV", "ServerFactory", "spec", "start_redis_or_skip"]

#: Set (CI sets it): a test that needs ``redis-server`` fails without it, not skips.
REQUIRE_REDIS_ENV = "STORMGUARD_REQUIRE_REDIS"


class ServerFactory:
    """``start(*flags, admin=False, fast=True, port=None)`` -> a fresh server (on a free
    port unless given); ``start.together(spec(...), spec(...))`` -> several, started side
    by side. The fixture stops them all at once after the test."""

    def __init__(self) -> None:
        self.started: list[RunningServer] = []

    def __call__(
        self, *args: str, admin: bool = False, fast: bool = True, port: int | None = None
    ) -> RunningServer:
        return self.together(spec(*args, admin=admin, fast=fast, port=port))[0]

    def together(self, *specs: ServerSpec) -> list[RunningServer]:
        servers = [launch_server(one) for one in specs]
        self.started += servers
        for server in servers:
            server.wait_ready()
        return servers


@pytest.fixture(scope="module")
def stormguard_server() -> Iterator[RunningServer]:
    """A reference server with admission on and the fast test engine, shared by a module."""
    with run_server() as server:
        yield server


@pytest.fixture
def stormguard_server_factory() -> Iterator[ServerFactory]:
    """A ``ServerFactory`` whose servers are stopped after the test."""
    factory = ServerFactory()
    try:
        yield factory
    finally:
        stop_servers(factory.started)
        remove_logs(factory.started)


def start_redis_or_skip(*, port: int | None = None) -> RedisServer:
    """A ``redis-server`` of the test's own (``start_redis``); without one on PATH the
    test skips, saying so, or fails where ``$STORMGUARD_REQUIRE_REDIS`` is set."""
    if shutil.which("redis-server") is None:
        reason = "redis-server is not on PATH (make setup-redis installs it)"
        if os.environ.get(REQUIRE_REDIS_ENV):
            pytest.fail(f"{reason}, and ${REQUIRE_REDIS_ENV} asks for the tests that need it")
        pytest.skip(reason)
    return start_redis(port=port)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A ``redis-server`` on a free loopback port, stopped after the test."""
    server = start_redis_or_skip()
    try:
        yield server
    finally:
        server.stop()
