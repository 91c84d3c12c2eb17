"""The provider-outage scenario's clients, each set up as an application with a primary
and a secondary provider would be (``outage/runner.py`` runs them):

- ``stormguard``: ``stormguard.AsyncClient`` over two ``Deployment``s, the primary of
  tier 1 and the secondary of tier 2, each with its own name for the model; the
  stream's ``first_chunk`` bound makes a late first token a failed attempt;
- ``litellm-router``: ``litellm.Router`` with one model group per provider and
  ``fallbacks=[{"primary": ["secondary"]}]``, 2 retries (``num_retries``), the call's
  deadline as ``timeout`` and the same first-chunk bound as ``stream_timeout``;
- ``openai``: ``openai.AsyncOpenAI`` on the primary alone, as it comes (2 retries);
- ``openai+tenacity``: the same inside the tutorials' retry decorator (5 attempts,
  1-2-4-8 s apart, on any exception).

Every call is streamed; the provider that served it is read from its chunks' ``model``
(each server knows the model under its own name: ``PRIMARY_MODEL``,
``SECONDARY_MODEL``). The caller gives up on a call at its deadline (``outage/runner.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import openai
import tenacity

import stormguard
from stormguard_drill.clients.drill_client import API_KEY, MODEL
from stormguard_drill.clients.litellm_client import import_litellm
from stormguard_drill.workload import Arrival

OutageClientName = Literal["stormguard", "litellm-router", "openai", "openai+tenacity"]
OUTAGE_CLIENTS: tuple[OutageClientName, ...] = get_args(OutageClientName)
OUTAGE_CLIENT_TITLES: dict[OutageClientName, str] = {
    "stormguard": "stormguard.AsyncClient, two Deployments (tier 1, tier 2)",
    "litellm-router": "litellm.Router, a model group per provider, fallbacks, 2 retries",
    "openai": "openai.AsyncOpenAI on the primary alone (2 retries)",
    "openai+tenacity": "openai.AsyncOpenAI on the primary alone, in a tenacity retry",
}
PRIMARY_MODEL = "sim-primary"
SECONDARY_MODEL = "sim-secondary"
Provider = Literal["primary", "secondary"]


@dataclass(frozen=True, slots=True)
class OutageCall:
    """One call as the application saw it."""

    ok: bool
    first_token_at: float | None = None  # time.monotonic() of the first chunk
    provider: Provider | None = None  # which one served it (None: failed, or unknown)
    error: str | None = None  # exception class name of a failure


class OutageClient(Protocol):
    name: OutageClientName

    async def call(self, arrival: Arrival) -> OutageCall: ...

    def stats(self) -> dict[str, Any]:
        """What the client itself counted (stormguard: attempts per deployment)."""
        ...

    async def aclose(self) -> None: ...


def provider_of(model: str | None) -> Provider | None:
    """The provider whose name for the model ``model`` is (a chunk's ``model``)."""
    if model is None:
        return None
    if SECONDARY_MODEL in model:
        return "secondary"
    if PRIMARY_MODEL in model:
        return "primary"
    return None


class _Tally:
    """The first chunk's time and model of one stream."""

    def __init__(self) -> None:
        self.first_at: float | None = None
        self.model: str | None = None

    def saw(self, chunk: Any) -> None:
        if self.model is None:
            self.model = getattr(chunk, "model", None) or None
        if self.first_at is None and getattr(chunk, "choices", None):
            self.first_at = time.monotonic()

    def outcome(self) -> OutageCall:
        return OutageCall(ok=True, first_token_at=self.first_at, provider=provider_of(self.model))


def _request(arrival: Arrival) -> dict[str, Any]:
    return {
        "messages": arrival.messages,
        "max_tokens": arrival.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class StormguardOutageClient:
    name: OutageClientName = "stormguard"

    def __init__(self, primary: str, secondary: str, deadline_s: float, first_chunk_s: float):
        self._client = stormguard.AsyncClient(
            base_url=[
                stormguard.Deployment(
                    primary, name="primary", tier=1, models={MODEL: PRIMARY_MODEL}, api_key=API_KEY
                ),
                stormguard.Deployment(
                    secondary,
                    name="secondary",
                    tier=2,
                    models={MODEL: SECONDARY_MODEL},
                    api_key=API_KEY,
                ),
            ],
            model=MODEL,
            timeout=deadline_s,
            stream_timeouts=stormguard.StreamTimeouts(first_chunk=first_chunk_s),
        )

    async def call(self, arrival: Arrival) -> OutageCall:
        tally = _Tally()
        try:
            stream = await self._client.chat.completions.create(**_request(arrival))
            async with stream:
                async for chunk in stream:
                    tally.saw(chunk)
        except stormguard.StormguardError as exc:
            return OutageCall(ok=False, error=type(exc).__name__)
        return tally.outcome()

    def stats(self) -> dict[str, Any]:
        stats = self._client.stats()
        return {
            "attempts": stats.attempts,
            "deployments": {
                d.deployment: {"attempts": d.attempts, "served": d.served, "failovers": d.failovers}
                for d in stats.deployments
            },
        }

    async def aclose(self) -> None:
        await self._client.close()


class LiteLLMRouterOutageClient:
    name: OutageClientName = "litellm-router"

    def __init__(self, primary: str, secondary: str, deadline_s: float, first_chunk_s: float):
        litellm = import_litellm()

        def group(name: str, base_url: str, model: str) -> dict[str, Any]:
            params = {"model": f"openai/{model}", "api_base": base_url, "api_key": API_KEY}
            return {"model_name": name, "litellm_params": params}

        self._router = litellm.Router(
            model_list=[
                group("primary", primary, PRIMARY_MODEL),
                group("secondary", secondary, SECONDARY_MODEL),
            ],
            fallbacks=[{"primary": ["secondary"]}],
            num_retries=2,
            timeout=deadline_s,
            stream_timeout=first_chunk_s,
        )

    async def call(self, arrival: Arrival) -> OutageCall:
        tally = _Tally()
        try:
            answer = await self._router.acompletion(model="primary", **_request(arrival))
            async for chunk in answer:
                tally.saw(chunk)
        except Exception as exc:  # LiteLLM's errors subclass openai's, and more
            return OutageCall(ok=False, error=type(exc).__name__)
        return tally.outcome()

    def stats(self) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        return None


class OpenAIOutageClient:
    def __init__(self, primary: str, deadline_s: float, *, tenacity_wrapper: bool) -> None:
        self.name: OutageClientName = "openai+tenacity" if tenacity_wrapper else "openai"
        self._tenacity = tenacity_wrapper
        self._client = openai.AsyncOpenAI(base_url=primary, api_key=API_KEY, timeout=deadline_s)

    async def call(self, arrival: Arrival) -> OutageCall:
        try:
            if not self._tenacity:
                return await self._call(arrival)
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(5),
                wait=tenacity.wait_exponential(multiplier=1, min=1, max=10),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._call(arrival)
            raise AssertionError("unreachable: tenacity reraises")
        except openai.OpenAIError as exc:
            return OutageCall(ok=False, error=type(exc).__name__)

    async def _call(self, arrival: Arrival) -> OutageCall:
        tally = _Tally()
        stream = await self._client.chat.completions.create(
            model=PRIMARY_MODEL, **_request(arrival)
        )
        async with stream:
            async for chunk in stream:
                tally.saw(chunk)
        return tally.outcome()

    def stats(self) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        await self._client.close()


def make_outage_client(
    name: OutageClientName, primary: str, secondary: str, deadline_s: float, first_chunk_s: float
) -> OutageClient:
    """The client ``name`` on the primary (and secondary) base URLs."""
    if name == "stormguard":
        return StormguardOutageClient(primary, secondary, deadline_s, first_chunk_s)
    if name == "litellm-router":
        return LiteLLMRouterOutageClient(primary, secondary, deadline_s, first_chunk_s)
    return OpenAIOutageClient(primary, deadline_s, tenacity_wrapper=name == "openai+tenacity")
