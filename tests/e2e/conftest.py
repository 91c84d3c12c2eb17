"""Fixtures that start the real reference server (see server_process.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.server_process import RunningServer, run_server


@pytest.fixture(scope="module")
def stormguard_server() -> Iterator[RunningServer]:
    """A reference server with admission on and the fast test engine, shared by a module."""
    with run_server() as server:
        yield server


@pytest.fixture
def stormguard_server_factory() -> Iterator[object]:
    """``start(*args, admin=False)`` -> a fresh server for this test, stopped afterwards."""
    import contextlib

    with contextlib.ExitStack() as stack:

        def start(*args: str, admin: bool = False, fast: bool = True) -> RunningServer:
            return stack.enter_context(run_server(*args, admin=admin, fast=fast))

        yield start
