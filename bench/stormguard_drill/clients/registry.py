"""The clients under test, each configured the way an application would.

- ``openai``: ``openai.AsyncOpenAI`` as it comes (2 retries, 0.5-8 s backoff);
  the caller's timeout is its ``timeout``, which openai applies to each attempt.
- ``openai+tenacity``: the same client inside the retry decorator found in most
  tutorials: 5 attempts, exponential wait 1, 2, 4, 8 s, on any exception.
- ``stormguard``: ``stormguard.AsyncClient`` with its default policy; the caller's
  timeout is its ``timeout``, the total of all attempts.
- ``openai+sg-httpx``: ``openai.AsyncOpenAI(max_retries=0)`` on
  ``stormguard.async_httpx_client`` (stormguard's whole pipeline as the transport).
- ``litellm``: ``litellm.acompletion(model="openai/...", num_retries=2, timeout=...)``.
- ``litellm-router``: ``litellm.Router(num_retries=2, timeout=...)``, one deployment
  per server (one server; every replica in the fleet).

The avalanche runs the first three (``AVALANCHE_CLIENTS``), the burst and the rebound
all of them, the fleet three over several replicas (``fleet_clients.py``). LiteLLM is
imported lazily, offline (``LITELLM_LOCAL_MODEL_COST_MAP``: otherwise its import
fetches a model cost map from the internet), so the drill works without it:
``unavailable()`` says why a client cannot run, and the drill skips it.

Every call streams (time to first token is measured at the first chunk) and asks
for the usage chunk, whose completion tokens are what goodput counts. Attempts
are counted where each client sends them: an httpx request hook for openai,
``client.stats()`` for stormguard and its transport; LiteLLM's are counted at the
server only (``attempts()`` is None), which is where every client's are comparable.

Where each lives: the names and the ``DrillClient`` protocol in ``drill_client.py``,
the openai-python ones in ``openai_clients.py``, stormguard's in
``stormguard_client.py`` (its figures in ``stormguard_figures.py``), LiteLLM's in
``litellm_client.py``; every name still imports from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from stormguard_drill.clients.drill_client import (
    AVALANCHE_CLIENTS,
    CLIENT_NAMES,
    LITELLM_CLIENTS,
    MODEL,
    CallOutcome,
    ClientName,
    ClientUnavailable,
    DrillClient,
)
from stormguard_drill.clients.litellm_client import LiteLLMClient, import_litellm
from stormguard_drill.clients.openai_clients import OpenAIClient, OpenAIOnStormguardClient
from stormguard_drill.clients.stormguard_client import StormguardClient
from stormguard_drill.clients.stormguard_figures import (
    CLIENT_IN_FLIGHT,
    CLIENT_LIMIT,
    CLIENT_PAUSED,
    CLIENT_WAITING,
)

__all__ = [
    "AVALANCHE_CLIENTS",
    "CLIENT_IN_FLIGHT",
    "CLIENT_LIMIT",
    "CLIENT_NAMES",
    "CLIENT_PAUSED",
    "CLIENT_WAITING",
    "LITELLM_CLIENTS",
    "MODEL",
    "CallOutcome",
    "ClientName",
    "ClientUnavailable",
    "DrillClient",
    "LiteLLMClient",
    "OpenAIClient",
    "OpenAIOnStormguardClient",
    "StormguardClient",
    "import_litellm",
    "make_client",
    "unavailable",
]


def unavailable(names: Sequence[ClientName]) -> dict[ClientName, str]:
    """The clients of ``names`` that cannot run here, with the reason."""
    if not LITELLM_CLIENTS & set(names):
        return {}
    try:
        import_litellm()
    except ClientUnavailable as exc:
        return {name: str(exc) for name in names if name in LITELLM_CLIENTS}
    return {}


def make_client(name: ClientName, base_url: str, timeout_s: float) -> DrillClient:
    if name == "stormguard":
        return StormguardClient(base_url, timeout_s)
    if name == "openai+sg-httpx":
        return OpenAIOnStormguardClient(base_url, timeout_s)
    if name in LITELLM_CLIENTS:
        return LiteLLMClient(base_url, timeout_s, router=name == "litellm-router")
    return OpenAIClient(base_url, timeout_s, tenacity_wrapper=name == "openai+tenacity")
