"""The ``stormguard`` client under test: ``stormguard.AsyncClient`` with its default
policy; the caller's timeout is its ``timeout``, the total of all attempts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx

import stormguard
from stormguard_drill.clients import attempt_log
from stormguard_drill.clients.drill_client import API_KEY, MODEL, CallOutcome, ClientName
from stormguard_drill.clients.stormguard_figures import limiter_gauges, stormguard_stats
from stormguard_drill.clients.stream_tally import StreamTally, whole_answer
from stormguard_drill.workload import Arrival


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
        stream: bool = True,
        quota: stormguard.QuotaPolicy | None = None,
    ) -> None:
        # Paced: a limiter of its own, as the default client has; not paced: none (the
        # calibration's closed loop paces itself). Record: each attempt goes into the
        # fleet's record (attempt_log), through an httpx client like the default one
        # (``httpx.AsyncClient()``) with a request hook; ejection_listeners see each
        # endpoint leave and rejoin the rotation (the fleet's record of them). stream:
        # every call streams (False: the whole answer at once, the quota's batch). quota:
        # the client's QuotaPolicy (None: the default one).
        self._stream = stream
        self._http = (
            httpx.AsyncClient(event_hooks={"request": [attempt_log.httpx_hook]}) if record else None
        )
        self._client = stormguard.AsyncClient(
            base_url=base_url if isinstance(base_url, str) else list(base_url),
            api_key=API_KEY,
            model=MODEL,
            timeout=timeout_s,
            concurrency=stormguard.ConcurrencyLimiter() if paced else None,
            http_client=self._http,
            ejection_listeners=ejection_listeners,
            quota=quota or stormguard.QuotaPolicy(),
        )

    def attempts(self) -> int | None:
        return self._client.stats().attempts

    def gauges(self) -> dict[str, float]:
        return limiter_gauges(self._client.stats())

    def stats(self) -> dict[str, float]:
        return stormguard_stats(self._client.stats())

    async def call(self, arrival: Arrival) -> CallOutcome:
        tally = StreamTally()
        try:
            if not self._stream:
                response = await self._client.chat.completions.create(
                    messages=arrival.messages, max_tokens=arrival.max_tokens
                )
                return whole_answer(response)
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
