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
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import httpx
import openai
import tenacity
from openai.types.chat import ChatCompletionUserMessageParam

import stormguard
from stormguard_drill import attempt_log
from stormguard_drill.workload import Arrival

ClientName = Literal[
    "openai", "openai+tenacity", "stormguard", "openai+sg-httpx", "litellm", "litellm-router"
]
CLIENT_NAMES: tuple[ClientName, ...] = get_args(ClientName)
AVALANCHE_CLIENTS: tuple[ClientName, ...] = CLIENT_NAMES[:3]
LITELLM_CLIENTS: frozenset[ClientName] = frozenset({"litellm", "litellm-router"})
MODEL = "stormguard-sim"
_API_KEY = "drill"  # the reference server does not check keys
_LITELLM_RETRIES = 2


class ClientUnavailable(Exception):
    """A client that cannot run here (LiteLLM not installed); the message says why."""


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """One call as the application sees it (the client's own retries inside)."""

    ok: bool
    completion_tokens: int = 0
    first_token_at: float | None = None  # time.monotonic() of the first chunk
    error: str | None = None  # exception class name of a failure


class DrillClient(Protocol):
    name: ClientName

    async def call(self, arrival: Arrival) -> CallOutcome: ...

    def attempts(self) -> int | None:
        """HTTP attempts sent so far, as the client counts them (None: it does not)."""
        ...

    def gauges(self) -> dict[str, float]:
        """The client's own state now, sampled with the server's metrics (stormguard:
        the concurrency limit); empty for clients without any."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters kept at the end of a pairing (stormguard: requeues, budgets)."""
        ...

    async def aclose(self) -> None: ...


# Sampled client gauges (summed over endpoints: the drill has one).
CLIENT_LIMIT = "drill_client_concurrency_limit"
CLIENT_IN_FLIGHT = "drill_client_in_flight"
CLIENT_WAITING = "drill_client_waiting"
CLIENT_PAUSED = "drill_client_paused_s"


def _limiter_gauges(snapshot: stormguard.CallStats) -> dict[str, float]:
    states = snapshot.concurrency
    if not states:
        return {}
    return {
        CLIENT_LIMIT: float(sum(s.limit for s in states)),
        CLIENT_IN_FLIGHT: float(sum(s.in_flight for s in states)),
        CLIENT_WAITING: float(sum(s.waiting for s in states)),
        CLIENT_PAUSED: max(s.paused_for for s in states),
    }


def _stormguard_stats(snapshot: stormguard.CallStats) -> dict[str, float]:
    stats: dict[str, float] = {
        "logical_calls": snapshot.logical_calls,
        "attempts": snapshot.attempts,
        "retries": snapshot.retries,
        "retries_refused_by_budget": snapshot.retries_refused_by_budget,
        "retry_amplification": snapshot.retry_amplification,
        "requeues": snapshot.requeues,
        "requeues_refused_by_budget": snapshot.requeues_refused_by_budget,
        "failovers": snapshot.failovers,
    }
    for state in snapshot.concurrency[:1]:
        stats.update(
            concurrency_limit=state.limit,
            concurrency_decreases=state.decreases,
            concurrency_refused=state.refused,
        )
    return stats


class _StreamTally:
    """First-chunk time and completion tokens of one stream."""

    def __init__(self) -> None:
        self.first_at: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None

    def saw(self, chunk: Any) -> None:
        if chunk.choices:
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.chunks += 1
        usage = getattr(chunk, "usage", None)  # LiteLLM's chunks may not have the field
        if usage is not None:
            self.usage_tokens = usage.completion_tokens

    def outcome(self) -> CallOutcome:
        tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        return CallOutcome(ok=True, completion_tokens=tokens, first_token_at=self.first_at)


class OpenAIClient:
    """openai-python with its defaults; optionally inside a tenacity retry."""

    def __init__(self, base_url: str, timeout_s: float, *, tenacity_wrapper: bool) -> None:
        self.name: ClientName = "openai+tenacity" if tenacity_wrapper else "openai"
        self._attempts = 0
        self._tenacity = tenacity_wrapper
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=_API_KEY,
            timeout=timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [self._count]}),
        )

    async def _count(self, request: Any) -> None:  # httpx2 on openai 3, httpx before
        self._attempts += 1
        attempt_log.record(str(request.url))  # the fleet's record (elsewhere: ignored)

    def attempts(self) -> int | None:
        return self._attempts

    def gauges(self) -> dict[str, float]:
        return {}

    def stats(self) -> dict[str, float]:
        return {}

    async def call(self, arrival: Arrival) -> CallOutcome:
        try:
            if not self._tenacity:
                return await self._stream(arrival)
            # The tutorial decorator: retry on anything, 5 attempts, 1-2-4-8 s apart.
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(5),
                wait=tenacity.wait_exponential(multiplier=1, min=1, max=10),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._stream(arrival)
            raise AssertionError("unreachable: tenacity reraises")
        except openai.OpenAIError as exc:
            return CallOutcome(ok=False, error=type(exc).__name__)

    async def _stream(self, arrival: Arrival) -> CallOutcome:
        return await _openai_stream(self._client, arrival)

    async def aclose(self) -> None:
        await self._client.close()


async def _openai_stream(client: openai.AsyncOpenAI, arrival: Arrival) -> CallOutcome:
    tally = _StreamTally()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[ChatCompletionUserMessageParam(role="user", content=arrival.prompt)],
        max_tokens=arrival.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async with stream:
        async for chunk in stream:
            tally.saw(chunk)
    return tally.outcome()


class OpenAIOnStormguardClient:
    """openai-python with ``max_retries=0`` on ``stormguard.async_httpx_client``: every
    request openai sends is one stormguard call (retries, pacing, breakers inside)."""

    name: ClientName = "openai+sg-httpx"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        # The drill's own key: without one the client would read OPENAI_API_KEY.
        http = stormguard.async_httpx_client(
            base_url=base_url, api_key=_API_KEY, model=MODEL, timeout=timeout_s
        )
        # The transport (httpx2's on openai 3, httpx's before) keeps the stormguard
        # client it runs, for its figures.
        self._stormguard: stormguard.AsyncClient = http._transport.client  # type: ignore[attr-defined]
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=_API_KEY,
            timeout=timeout_s,
            http_client=http,
            max_retries=0,
        )

    def attempts(self) -> int | None:
        return self._stormguard.stats().attempts

    def gauges(self) -> dict[str, float]:
        return _limiter_gauges(self._stormguard.stats())

    def stats(self) -> dict[str, float]:
        return _stormguard_stats(self._stormguard.stats())

    async def call(self, arrival: Arrival) -> CallOutcome:
        try:
            return await _openai_stream(self._client, arrival)
        except openai.OpenAIError as exc:
            return CallOutcome(ok=False, error=type(exc).__name__)

    async def aclose(self) -> None:
        await self._client.close()


class StormguardClient:
    """stormguard.AsyncClient with its default retry policy, budget and breakers; over
    several servers when ``base_url`` lists them (the fleet)."""

    name: ClientName = "stormguard"

    def __init__(
        self,
        base_url: str | Sequence[str],
        timeout_s: float,
        *,
        paced: bool = True,
        record: bool = False,
        ejection_listeners: Sequence[Callable[[stormguard.EjectionTransition], None]] = (),
    ) -> None:
        # Paced: a limiter of its own, as the default client has; not paced: none (the
        # calibration's closed loop paces itself). Record: each attempt goes into the
        # fleet's record (attempt_log), through an httpx client like the default one
        # (``httpx.AsyncClient()``) with a request hook; ejection_listeners see each
        # endpoint leave and rejoin the rotation (the fleet's record of them).
        self._http = (
            httpx.AsyncClient(event_hooks={"request": [attempt_log.httpx_hook]}) if record else None
        )
        self._client = stormguard.AsyncClient(
            base_url=base_url if isinstance(base_url, str) else list(base_url),
            api_key=_API_KEY,
            model=MODEL,
            timeout=timeout_s,
            concurrency=stormguard.ConcurrencyLimiter() if paced else None,
            http_client=self._http,
            ejection_listeners=ejection_listeners,
        )

    def attempts(self) -> int | None:
        return self._client.stats().attempts

    def gauges(self) -> dict[str, float]:
        return _limiter_gauges(self._client.stats())

    def stats(self) -> dict[str, float]:
        return _stormguard_stats(self._client.stats())

    async def call(self, arrival: Arrival) -> CallOutcome:
        tally = _StreamTally()
        try:
            stream = await self._client.chat.completions.create(
                messages=arrival.messages,
                max_tokens=arrival.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with stream:
                async for chunk in stream:
                    tally.saw(chunk)
        except stormguard.StormguardError as exc:
            return CallOutcome(ok=False, error=type(exc).__name__)
        return tally.outcome()

    async def aclose(self) -> None:
        await self._client.close()
        if self._http is not None:
            await self._http.aclose()


def import_litellm() -> Any:
    """LiteLLM, imported offline and quiet; ``ClientUnavailable`` where it cannot be."""
    # Before the import: without it, importing litellm fetches a model cost map from
    # the internet (this drill sends traffic to 127.0.0.1 only).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        litellm: Any = importlib.import_module("litellm")
    except Exception as exc:  # ImportError, or an import that breaks in this environment
        raise ClientUnavailable(
            f"litellm cannot be imported ({type(exc).__name__}: {exc});"
            " pip install litellm to run the LiteLLM clients"
        ) from exc
    litellm.suppress_debug_info = True
    if hasattr(litellm, "telemetry"):
        litellm.telemetry = False
    return litellm


class LiteLLMClient:
    """``litellm.acompletion`` with 2 retries, or a ``litellm.Router`` with 2 retries
    over one deployment per server of ``base_url`` (one, or several: the fleet); the
    caller's timeout is LiteLLM's ``timeout``."""

    def __init__(self, base_url: str | Sequence[str], timeout_s: float, *, router: bool) -> None:
        self.name: ClientName = "litellm-router" if router else "litellm"
        self._litellm = import_litellm()
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self._base_url = urls[0]
        self._timeout_s = timeout_s
        self._router: Any = None
        if router:
            deployments = [
                {
                    "model_name": MODEL,
                    "litellm_params": {
                        "model": f"openai/{MODEL}",
                        "api_base": url,
                        "api_key": _API_KEY,
                    },
                }
                for url in urls
            ]
            self._router = self._litellm.Router(
                model_list=deployments, num_retries=_LITELLM_RETRIES, timeout=timeout_s
            )
        elif len(urls) > 1:
            raise ValueError("litellm.acompletion takes one server: use the Router for several")

    def attempts(self) -> int | None:
        return None  # counted at the server

    def gauges(self) -> dict[str, float]:
        return {}

    def stats(self) -> dict[str, float]:
        return {}

    async def call(self, arrival: Arrival) -> CallOutcome:
        tally = _StreamTally()
        request: dict[str, Any] = {
            "messages": arrival.messages,
            "max_tokens": arrival.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            if self._router is not None:
                stream = await self._router.acompletion(model=MODEL, **request)
            else:
                stream = await self._litellm.acompletion(
                    model=f"openai/{MODEL}",
                    api_base=self._base_url,
                    api_key=_API_KEY,
                    num_retries=_LITELLM_RETRIES,
                    timeout=self._timeout_s,
                    **request,
                )
            async for chunk in stream:
                tally.saw(chunk)
        except Exception as exc:  # LiteLLM's errors subclass openai's, and more
            return CallOutcome(ok=False, error=type(exc).__name__)
        return tally.outcome()

    async def aclose(self) -> None:
        return None  # LiteLLM caches its HTTP clients per api_base; a dead port's idle


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
