"""The avalanche's, the burst's and the rebound's clients by name: ``unavailable()``
says why one cannot run here (LiteLLM not installed), ``make_client()`` builds one
against a single server. The clients themselves, and what each is: the package's
doc (``stormguard_drill.clients``)."""

from __future__ import annotations

from collections.abc import Sequence

from stormguard_drill.clients.drill_client import (
    LITELLM_CLIENTS,
    ClientName,
    ClientUnavailable,
    DrillClient,
)
from stormguard_drill.clients.litellm_client import LiteLLMClient, import_litellm
from stormguard_drill.clients.openai_clients import OpenAIClient, OpenAIOnStormguardClient
from stormguard_drill.clients.stormguard_client import StormguardClient


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
