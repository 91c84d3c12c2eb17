"""Fixtures that start the real reference server (see server_process.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.server_process import RunningServer, run_server

ServerFactory = Callable[..., RunningServer]


@pytest.fixture(scope="module")
def stormguard_server() -> Iterator[RunningServer]:
    """A reference server with admission on and the fast test engine, shared by a module."""
    with run_server() as server:
        yield server


@pytest.fixture
def stormguard_server_factory() -> Iterator[ServerFactory]:
    """``start(*flags, admin=False, fast=True, port=None)`` -> a fresh server (on a free
    port unless given), stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(
            *args: str, admin: bool = False, fast: bool = True, port: int | None = None
        ) -> RunningServer:
            return stack.enter_context(run_server(*args, admin=admin, fast=fast, port=port))

        yield start
