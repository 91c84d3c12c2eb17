"""The replicas scenario's clients, each over every replica of its pairing:

- ``stormguard``: ``stormguard.AsyncClient(base_url=[...])`` as it comes (no affinity,
  no hedging);
- ``stormguard-affinity``: the same with ``AffinityPolicy()``, each call keyed by its
  conversation (``prompt_cache_key``);
- ``stormguard-hedge``: the same with ``HedgePolicy()``;
- ``stormguard-hedge-latency``: the same with ``HedgePolicy()`` and
  ``LatencyRouting()`` (a hedge's cancelled primary raises its replica's estimate);
- ``litellm-router``: ``litellm.Router(routing_strategy="least-busy")``, a deployment per
  replica, 2 retries.

Every call is streamed; the caller's deadline bounds it (``runner.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import stormguard
from stormguard_drill.clients.drill_client import API_KEY, MODEL
from stormguard_drill.clients.litellm_client import import_litellm
from stormguard_drill.replicas.config import Part

ReplicasClientName = Literal[
    "stormguard",
    "stormguard-affinity",
    "stormguard-hedge",
    "stormguard-hedge-latency",
    "litellm-router",
]
REPLICAS_CLIENTS: tuple[ReplicasClientName, ...] = get_args(ReplicasClientName)
#: Each part's clients, the first one the baseline its claims are measured against.
PART_CLIENTS: dict[Part, tuple[ReplicasClientName, ...]] = {
    "affinity": ("stormguard", "stormguard-affinity", "litellm-router"),
    "hedging": ("stormguard", "stormguard-hedge", "stormguard-hedge-latency", "litellm-router"),
}
REPLICAS_CLIENT_TITLES: dict[ReplicasClientName, str] = {
    "stormguard": "stormguard.AsyncClient over the replicas, as it comes",
    "stormguard-affinity": "the same, AffinityPolicy(), keyed by conversation",
    "stormguard-hedge": "the same, HedgePolicy()",
    "stormguard-hedge-latency": "the same, HedgePolicy() and LatencyRouting()",
    "litellm-router": "litellm.Router, least-busy, a deployment per replica, 2 retries",
}


@dataclass(frozen=True, slots=True)
class ReplicaCall:
    """One call as the application saw it."""

    ok: bool
    first_token_at: float | None = None  # time.monotonic() of the first chunk
    error: str | None = None  # exception class name of a failure


class ReplicasClient(Protocol):
    name: ReplicasClientName

    async def call(
        self, messages: list[dict[str, str]], max_tokens: int, key: str | None
    ) -> ReplicaCall:
        """One streamed call; ``key`` names its conversation (affinity's key)."""
        ...

    def stats(self) -> dict[str, Any]:
        """What the client itself counted (stormguard: attempts, hedges)."""
        ...

    async def aclose(self) -> None: ...


def _first_chunk(chunk: Any, first: float | None) -> float | None:
    if first is None and getattr(chunk, "choices", None):
        return time.monotonic()
    return first


class StormguardReplicasClient:
    def __init__(self, name: ReplicasClientName, urls: Sequence[str], deadline_s: float) -> None:
        self.name = name
        self._keyed = name == "stormguard-affinity"
        self._client = stormguard.AsyncClient(
            base_url=list(urls),
            api_key=API_KEY,
            model=MODEL,
            timeout=deadline_s,
            affinity=stormguard.AffinityPolicy() if self._keyed else None,
            hedge=stormguard.HedgePolicy() if name.startswith("stormguard-hedge") else None,
            latency_routing=(
                stormguard.LatencyRouting() if name == "stormguard-hedge-latency" else None
            ),
        )

    async def call(
        self, messages: list[dict[str, str]], max_tokens: int, key: str | None
    ) -> ReplicaCall:
        first = None
        extra = {"prompt_cache_key": key} if self._keyed and key is not None else None
        try:
            stream = await self._client.chat.completions.create(
                messages=messages,
                max_tokens=max_tokens,
                stream=True,
                extra_body=extra,
            )
            async with stream:
                async for chunk in stream:
                    first = _first_chunk(chunk, first)
        except stormguard.StormguardError as exc:
            return ReplicaCall(ok=False, error=type(exc).__name__)
        return ReplicaCall(ok=True, first_token_at=first)

    def stats(self) -> dict[str, Any]:
        stats = self._client.stats()
        return {
            "attempts": stats.attempts,
            "hedges_sent": stats.hedges_sent,
            "hedges_won": stats.hedges_won,
        }

    async def aclose(self) -> None:
        await self._client.close()


class LiteLLMRouterReplicasClient:
    name: ReplicasClientName = "litellm-router"

    def __init__(self, urls: Sequence[str], deadline_s: float) -> None:
        litellm = import_litellm()
        self._router = litellm.Router(
            model_list=[
                {
                    "model_name": MODEL,
                    "litellm_params": {
                        "model": f"openai/{MODEL}",
                        "api_base": url,
                        "api_key": API_KEY,
                    },
                }
                for url in urls
            ],
            routing_strategy="least-busy",
            num_retries=2,
            timeout=deadline_s,
        )

    async def call(
        self, messages: list[dict[str, str]], max_tokens: int, key: str | None
    ) -> ReplicaCall:
        first = None
        try:
            answer = await self._router.acompletion(
                model=MODEL, messages=messages, max_tokens=max_tokens, stream=True
            )
            async for chunk in answer:
                first = _first_chunk(chunk, first)
        except Exception as exc:  # LiteLLM's errors subclass openai's, and more
            return ReplicaCall(ok=False, error=type(exc).__name__)
        return ReplicaCall(ok=True, first_token_at=first)

    def stats(self) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        return None


def make_replicas_client(
    name: ReplicasClientName, urls: Sequence[str], deadline_s: float
) -> ReplicasClient:
    """The client ``name`` over the replicas' base URLs."""
    if name == "litellm-router":
        return LiteLLMRouterReplicasClient(urls, deadline_s)
    return StormguardReplicasClient(name, urls, deadline_s)
