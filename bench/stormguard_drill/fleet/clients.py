"""The fleet's clients: each one over every replica, configured as an application would.

- ``openai``: openai-python has no notion of several servers; the application picks
  a replica at random for each call (one ``AsyncOpenAI`` per replica, default
  retries, which go to the replica picked).
- ``litellm-router``: ``litellm.Router`` with one deployment per replica and 2
  retries (its default routing, cooldowns and allowed fails): the peer for several
  deployments.
- ``stormguard``: ``stormguard.AsyncClient(base_url=[...every replica...])`` with its
  default options.

Each client process builds its own (``fleet/worker.py``), so per-process state
(breakers, budget, limiter, ejections, LiteLLM's cooldowns) is kept per process, as in
a real fleet. Every attempt is filed in ``attempt_log``; stormguard's ejections and
returns of endpoints go to ``on_ejection``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import stormguard
from stormguard_drill.clients import attempt_log
from stormguard_drill.clients.drill_client import CallOutcome, ClientName, DrillClient
from stormguard_drill.clients.litellm_client import LiteLLMClient, import_litellm
from stormguard_drill.clients.openai_clients import OpenAIClient
from stormguard_drill.clients.stormguard_client import StormguardClient
from stormguard_drill.workload import Arrival

FLEET_CLIENTS: tuple[ClientName, ...] = ("openai", "litellm-router", "stormguard")
FLEET_CLIENT_TITLES: dict[str, str] = {
    "openai": "openai-python, a random replica per call",
    "litellm-router": "LiteLLM Router over the replicas",
    "stormguard": "stormguard, Client(base_url=[every replica])",
}


class RandomPickClient:
    """openai-python with its defaults, on a replica drawn at random for each call."""

    name: ClientName = "openai"

    def __init__(self, base_urls: Sequence[str], timeout_s: float, seed: int) -> None:
        self._clients = [OpenAIClient(url, timeout_s, tenacity_wrapper=False) for url in base_urls]
        self._rng = random.Random(seed)

    def attempts(self) -> int | None:
        return sum(client.attempts() or 0 for client in self._clients)

    def gauges(self) -> dict[str, float]:
        return {}

    def stats(self) -> dict[str, float]:
        return {}

    async def call(self, arrival: Arrival) -> CallOutcome:
        return await self._rng.choice(self._clients).call(arrival)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


_LITELLM_LOGGER_INSTALLED = False


def _record_litellm_attempts() -> None:
    """Add the attempt logger to LiteLLM's callbacks, once per process."""
    global _LITELLM_LOGGER_INSTALLED
    if not _LITELLM_LOGGER_INSTALLED:
        litellm = import_litellm()
        litellm.callbacks = [*(litellm.callbacks or []), attempt_log.litellm_logger()]
        _LITELLM_LOGGER_INSTALLED = True


def make_fleet_client(
    name: ClientName,
    base_urls: Sequence[str],
    timeout_s: float,
    seed: int,
    on_ejection: Callable[[stormguard.EjectionTransition], None] | None = None,
) -> DrillClient:
    """``name``'s client over every replica of ``base_urls``, recording its attempts
    (and, stormguard's, each change of an endpoint's ejection status)."""
    if name == "openai":
        return RandomPickClient(base_urls, timeout_s, seed)
    if name == "litellm-router":
        _record_litellm_attempts()
        return LiteLLMClient(base_urls, timeout_s, router=True)
    if name == "stormguard":
        listeners = () if on_ejection is None else (on_ejection,)
        return StormguardClient(base_urls, timeout_s, record=True, ejection_listeners=listeners)
    raise ValueError(f"{name} is not a fleet client: choose from {', '.join(FLEET_CLIENTS)}")
