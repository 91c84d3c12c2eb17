"""Fixtures for the tests against real vLLM (CPU build). Skipped where vLLM is absent:
`make test-vllm` sets up the environment that has it and runs them."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from stormguard_server.vllm.tiny_model import build_tiny_model
from tests.vllm.vllm_process import VllmServer, run_vllm

if importlib.util.find_spec("vllm") is None:
    # Not collected at all without vLLM (the default `make test` environment).
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def guarded_vllm(tiny_model: str) -> Iterator[VllmServer]:
    """vLLM behind stormguard's admission: small queue so a flood is shed. One for the
    session: each start costs 20 s to minutes of a small machine's CPU."""
    with run_vllm(tiny_model, "--max-queue-requests", "6", "--max-queue-wait-s", "5") as server:
        yield server


@pytest.fixture(scope="module")
def plain_vllm(tiny_model: str) -> Iterator[VllmServer]:
    """vLLM without the middleware, shedding with its own --max-num-queued-reqs."""
    with run_vllm(
        tiny_model, "--max-num-queued-reqs", "1", "--max-num-seqs", "2", admission=False
    ) as server:
        yield server
