"""Fixtures that start the real reference server (see server_process.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.server_process import (
    RunningServer,
    ServerSpec,
    launch_server,
    remove_logs,
    run_server,
    spec,
    stop_servers,
)

__all__ = ["ServerFactory", "spec"]


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
