"""The quota scenario's clients, each configured as an application on one API key would.

- ``stormguard-sync``: ``stormguard.Client`` with its defaults, in threads; the call's
  deadline is its ``timeout`` (the total of all attempts);
- ``stormguard-async``: ``stormguard.AsyncClient`` with its defaults, in tasks (the
  drill's ``stormguard``);
- ``stormguard-sync+redis``, ``stormguard-async+redis``: the same with
  ``QuotaPolicy(redis_url=...)``, so that every process paces the key on one bucket
  in Redis (a ``redis-server`` of the run's own, as for LiteLLM's Redis row);
- ``openai``: ``openai.AsyncOpenAI`` as it comes (2 retries, which honour Retry-After);
- ``openai+tenacity``: the same inside the drill's tutorial retry decorator (5 attempts,
  1-2-4-8 s apart, on any exception);
- ``openai+sg-httpx``: ``openai.AsyncOpenAI(max_retries=0)`` on
  ``stormguard.async_httpx_client`` (the async twin of ``stormguard.httpx_client()``);
- ``litellm-router``: ``litellm.Router`` with the key's ``tpm`` and ``rpm`` on its
  deployment and ``routing_strategy="usage-based-routing-v2"``, the strategy LiteLLM's
  routing docs give for limits ("filters out deployment if tpm/rpm limit exceeded"),
  ``num_retries`` left at its default (2); each process counts its own usage;
- ``litellm-router+redis``: the same Router with ``redis_host``/``redis_port``, so that
  every process counts usage in one Redis, as LiteLLM's docs advise for several
  instances (a ``redis-server`` of the run's own: ``redis_server.py``).

All but the ``stormguard-sync`` rows are the drill's own builders (``clients/``), in
tasks; the call's deadline is their ``timeout`` too (openai's and LiteLLM's apply to
each attempt), and the caller gives up on a call at its deadline (``app.run_logical``).

A batch job wants whole answers: calls are not streamed unless ``--stream`` asks. It
matters to LiteLLM: its usage-based routing counts a call's tokens in its success
callback, and (LiteLLM 1.110.2, measured) a streamed call's never reach its count,
so with streams only its RPM limit is enforced.
"""

from __future__ import annotations

import stormguard
from stormguard_drill.clients.drill_client import API_KEY, MODEL, CallOutcome, DrillClient
from stormguard_drill.clients.litellm_client import LiteLLMClient, import_litellm
from stormguard_drill.clients.openai_clients import OpenAIClient, OpenAIOnStormguardClient
from stormguard_drill.clients.stormguard_client import StormguardClient
from stormguard_drill.clients.stormguard_figures import stormguard_stats
from stormguard_drill.clients.stream_tally import StreamTally, whole_answer
from stormguard_drill.quota.client_names import (
    LITELLM_QUOTA_CLIENTS,
    QUOTA_CLIENTS,
    REDIS_CLIENTS,
    QuotaClientName,
)
from stormguard_drill.quota.config import QuotaLimits
from stormguard_drill.workload import Arrival

# The Router's strategy that reads a deployment's tpm and rpm (LiteLLM's routing docs).
LITELLM_ROUTING_STRATEGY = "usage-based-routing-v2"


class SyncStormguardClient:
    """``stormguard.Client`` with its defaults (with ``redis``, the key's bucket shared
    in that Redis): one chat call at a time per thread (streamed, or the whole answer at
    once); the call's deadline is its ``timeout``."""

    name: QuotaClientName = "stormguard-sync"

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        *,
        stream: bool = False,
        redis: tuple[str, int] | None = None,
    ) -> None:
        self._stream = stream
        self._client = stormguard.Client(
            base_url=base_url,
            api_key=API_KEY,
            model=MODEL,
            timeout=timeout_s,
            quota=quota_policy(redis),
        )

    def attempts(self) -> int | None:
        return self._client.stats().attempts

    def stats(self) -> dict[str, float]:
        return stormguard_stats(self._client.stats())

    def call(self, arrival: Arrival) -> CallOutcome:
        tally = StreamTally()
        try:
            if not self._stream:
                response = self._client.chat.completions.create(
                    messages=arrival.messages, max_tokens=arrival.max_tokens
                )
                return whole_answer(response)
            stream = self._client.chat.completions.create(
                messages=arrival.messages,
                max_tokens=arrival.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            with stream:
                for chunk in stream:
                    tally.saw(chunk)
        except stormguard.StormguardError as exc:
            return CallOutcome(ok=False, error=type(exc).__name__)
        return tally.outcome()

    def close(self) -> None:
        self._client.close()


def quota_policy(redis: tuple[str, int] | None) -> stormguard.QuotaPolicy:
    """The default ``QuotaPolicy``, or with ``redis`` (host, port) its bucket in Redis."""
    if redis is None:
        return stormguard.QuotaPolicy()
    return stormguard.QuotaPolicy(redis_url=f"redis://{redis[0]}:{redis[1]}/0")


def quota_unavailable(names: tuple[QuotaClientName, ...]) -> dict[QuotaClientName, str]:
    """The clients of ``names`` that cannot run here, with the reason (LiteLLM not
    importable; for the Redis row, no ``redis-server`` or no ``redis`` package)."""
    reasons: dict[QuotaClientName, str] = {}
    if LITELLM_QUOTA_CLIENTS & set(names):
        try:
            import_litellm()
        except Exception as exc:  # ClientUnavailable, with its reason
            reasons.update({n: str(exc) for n in names if n in LITELLM_QUOTA_CLIENTS})
    if REDIS_CLIENTS & set(names) - reasons.keys():
        why = _redis_unavailable()
        if why is not None:
            reasons.update({n: why for n in names if n in REDIS_CLIENTS})
    return reasons


def _redis_unavailable() -> str | None:
    import importlib.util
    import shutil

    if shutil.which("redis-server") is None:
        return "redis-server is not on PATH (make setup-redis): the Redis row is skipped"
    if importlib.util.find_spec("redis") is None:
        return "the redis package is not installed (pip install -e '.[bench]'): skipped"
    return None


def make_async_quota_client(
    name: QuotaClientName,
    base_url: str,
    timeout_s: float,
    limits: QuotaLimits,
    redis: tuple[str, int] | None = None,
    *,
    stream: bool = False,
) -> DrillClient:
    """``name``'s client in tasks (every client but ``stormguard-sync``)."""
    if name in ("stormguard-async", "stormguard-async+redis"):
        if name in REDIS_CLIENTS and redis is None:
            raise ValueError(f"{name} needs a Redis server")
        quota = quota_policy(redis if name in REDIS_CLIENTS else None)
        return StormguardClient(base_url, timeout_s, stream=stream, quota=quota)
    if name in ("openai", "openai+tenacity"):
        tenacity_wrapper = name == "openai+tenacity"
        return OpenAIClient(base_url, timeout_s, tenacity_wrapper=tenacity_wrapper, stream=stream)
    if name == "openai+sg-httpx":
        return OpenAIOnStormguardClient(base_url, timeout_s, stream=stream)
    if name in LITELLM_QUOTA_CLIENTS:
        options: dict[str, object] = {"routing_strategy": LITELLM_ROUTING_STRATEGY}
        if name in REDIS_CLIENTS:
            if redis is None:
                raise ValueError(f"{name} needs a Redis server")
            options.update(redis_host=redis[0], redis_port=redis[1])
        return LiteLLMClient(
            base_url,
            timeout_s,
            router=True,
            num_retries=None,
            deployment={"tpm": limits.tpm, "rpm": limits.rpm},
            router_options=options,
            stream=stream,
        )
    raise ValueError(f"{name} does not run in tasks: choose from {', '.join(QUOTA_CLIENTS)}")
