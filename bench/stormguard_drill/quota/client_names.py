"""The quota scenario's clients by name (``--clients``): which run in threads, which
share the key's usage in a Redis, which are LiteLLM's, and each one's title in the
table. The clients themselves: ``quota/clients.py``."""

from __future__ import annotations

from typing import Literal, get_args

QuotaClientName = Literal[
    "stormguard-sync",
    "stormguard-async",
    "stormguard-sync+redis",
    "stormguard-async+redis",
    "openai",
    "openai+tenacity",
    "openai+sg-httpx",
    "litellm-router",
    "litellm-router+redis",
]
QUOTA_CLIENTS: tuple[QuotaClientName, ...] = get_args(QuotaClientName)
LITELLM_QUOTA_CLIENTS: frozenset[QuotaClientName] = frozenset(
    {"litellm-router", "litellm-router+redis"}
)
REDIS_CLIENTS: frozenset[QuotaClientName] = frozenset(
    {"stormguard-sync+redis", "stormguard-async+redis", "litellm-router+redis"}
)
# The clients that run in threads (their calls block); the others in asyncio tasks.
THREADED_CLIENTS: frozenset[QuotaClientName] = frozenset(
    {"stormguard-sync", "stormguard-sync+redis"}
)
QUOTA_CLIENT_TITLES: dict[str, str] = {
    "stormguard-sync": "stormguard.Client (defaults), threads",
    "stormguard-async": "stormguard.AsyncClient (defaults), tasks",
    "stormguard-sync+redis": "stormguard.Client, QuotaPolicy(redis_url=...), threads",
    "stormguard-async+redis": "stormguard.AsyncClient, QuotaPolicy(redis_url=...), tasks",
    "openai": "openai.AsyncOpenAI (defaults: 2 retries)",
    "openai+tenacity": "openai.AsyncOpenAI in tenacity (5 attempts, 1-2-4-8 s)",
    "openai+sg-httpx": "openai.AsyncOpenAI(max_retries=0) on stormguard.async_httpx_client",
    "litellm-router": "litellm.Router, tpm/rpm on the deployment, usage-based-routing-v2",
    "litellm-router+redis": "the same Router with redis_host/redis_port (usage shared)",
}
