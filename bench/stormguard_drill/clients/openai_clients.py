"""The clients built on openai-python: ``openai`` (its defaults), ``openai+tenacity``
(inside the tutorials' retry decorator) and ``openai+sg-httpx`` (no retries of its own,
on stormguard's httpx transport). Each counts the attempts it sends."""

from __future__ import annotations

from typing import Any

import openai
import tenacity
from openai.types.chat import ChatCompletionUserMessageParam

import stormguard
from stormguard_drill.clients import attempt_log
from stormguard_drill.clients.drill_client import API_KEY, MODEL, CallOutcome, ClientName
from stormguard_drill.clients.stormguard_figures import limiter_gauges, stormguard_stats
from stormguard_drill.clients.stream_tally import StreamTally, whole_answer
from stormguard_drill.workload import Arrival


class OpenAIClient:
    """openai-python with its defaults; optionally inside a tenacity retry."""

    def __init__(
        self, base_url: str, timeout_s: float, *, tenacity_wrapper: bool, stream: bool = True
    ) -> None:
        self.name: ClientName = "openai+tenacity" if tenacity_wrapper else "openai"
        self._streamed = stream
        self._attempts = 0
        self._tenacity = tenacity_wrapper
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=API_KEY,
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
                return await self._call(arrival)
            # The tutorial decorator: retry on anything, 5 attempts, 1-2-4-8 s apart.
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
            return CallOutcome(ok=False, error=type(exc).__name__)

    async def _call(self, arrival: Arrival) -> CallOutcome:
        return await openai_call(self._client, arrival, stream=self._streamed)

    async def aclose(self) -> None:
        await self._client.close()


async def openai_call(
    client: openai.AsyncOpenAI, arrival: Arrival, *, stream: bool = True
) -> CallOutcome:
    """One chat completion of ``arrival``: streamed, with the usage chunk asked for, or
    (``stream=False``) the whole answer at once."""
    if not stream:
        response = await client.chat.completions.create(
            model=MODEL,
            messages=[ChatCompletionUserMessageParam(role="user", content=arrival.prompt)],
            max_tokens=arrival.max_tokens,
        )
        return whole_answer(response)
    return await openai_stream(client, arrival)


async def openai_stream(client: openai.AsyncOpenAI, arrival: Arrival) -> CallOutcome:
    """One streamed chat completion of ``arrival``, with the usage chunk asked for."""
    tally = StreamTally()
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

    def __init__(self, base_url: str, timeout_s: float, *, stream: bool = True) -> None:
        self._streamed = stream
        # The drill's own key: without one the client would read OPENAI_API_KEY.
        http = stormguard.async_httpx_client(
            base_url=base_url, api_key=API_KEY, model=MODEL, timeout=timeout_s
        )
        # The transport (httpx2's on openai 3, httpx's before) keeps the stormguard
        # client it runs, for its figures.
        self._stormguard: stormguard.AsyncClient = http._transport.client  # type: ignore[attr-defined]
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=API_KEY,
            timeout=timeout_s,
            http_client=http,
            max_retries=0,
        )

    def attempts(self) -> int | None:
        return self._stormguard.stats().attempts

    def gauges(self) -> dict[str, float]:
        return limiter_gauges(self._stormguard.stats())

    def stats(self) -> dict[str, float]:
        return stormguard_stats(self._stormguard.stats())

    async def call(self, arrival: Arrival) -> CallOutcome:
        try:
            return await openai_call(self._client, arrival, stream=self._streamed)
        except openai.OpenAIError as exc:
            return CallOutcome(ok=False, error=type(exc).__name__)

    async def aclose(self) -> None:
        await self._client.close()
