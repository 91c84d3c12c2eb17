"""The three clients under test, each configured the way an application would.

- ``openai``: ``openai.AsyncOpenAI`` as it comes (2 retries, 0.5-8 s backoff);
  the caller's timeout is its ``timeout``, which openai applies to each attempt.
- ``openai+tenacity``: the same client inside the retry decorator found in most
  tutorials: 5 attempts, exponential wait 1, 2, 4, 8 s, on any exception.
- ``stormguard``: ``stormguard.AsyncClient`` with its default policy; the caller's
  timeout is its ``timeout``, the total of all attempts.

Every call streams (time to first token is measured at the first chunk) and asks
for the usage chunk, whose completion tokens are what goodput counts. Attempts
are counted where each client sends them: an httpx request hook for openai,
``client.stats()`` for stormguard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import openai
import tenacity
from openai.types.chat import ChatCompletionUserMessageParam

import stormguard
from stormguard_server.drill.workload import Arrival

ClientName = Literal["openai", "openai+tenacity", "stormguard"]
CLIENT_NAMES: tuple[ClientName, ...] = ("openai", "openai+tenacity", "stormguard")
MODEL = "stormguard-sim"
_API_KEY = "drill"  # the reference server does not check keys


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

    def attempts(self) -> int: ...

    async def aclose(self) -> None: ...


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
        if chunk.usage is not None:
            self.usage_tokens = chunk.usage.completion_tokens

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

    async def _count(self, request: object) -> None:  # httpx2 on openai 3, httpx before
        self._attempts += 1

    def attempts(self) -> int:
        return self._attempts

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
        tally = _StreamTally()
        stream = await self._client.chat.completions.create(
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

    async def aclose(self) -> None:
        await self._client.close()


class StormguardClient:
    """stormguard.AsyncClient with its default retry policy, budget and breakers."""

    name: ClientName = "stormguard"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self._client = stormguard.AsyncClient(
            base_url=base_url, api_key=_API_KEY, model=MODEL, timeout=timeout_s
        )

    def attempts(self) -> int:
        return self._client.stats().attempts

    def stats(self) -> stormguard.CallStats:
        return self._client.stats()

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


def make_client(name: ClientName, base_url: str, timeout_s: float) -> DrillClient:
    if name == "stormguard":
        return StormguardClient(base_url, timeout_s)
    return OpenAIClient(base_url, timeout_s, tenacity_wrapper=name == "openai+tenacity")
