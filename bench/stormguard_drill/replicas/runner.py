"""Runs one part of the replicas scenario: fresh replicas (prefix caching on), then
each client's calls replayed over them in turn, the caches emptied before each and
the replicas' counters read before and after; in the hedging part, one replica
slowed through its admin endpoint for the middle window."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stormguard_drill.replicas.clients import (
    ReplicasClient,
    ReplicasClientName,
    make_replicas_client,
)
from stormguard_drill.replicas.config import Part, ReplicasConfig
from stormguard_drill.replicas.conversations import Conversation
from stormguard_drill.replicas.records import COUNTERS, CallRecord, ReplicasRun
from stormguard_drill.servers import ServerFleet, ServerProcess

_IDLE_TIMEOUT_S = 10.0
_IN_FLIGHT = "stormguard_http_requests_in_flight"
_WORDS = ("replica", "prefix", "block", "hedge", "cache", "route", "token", "answer")


async def run_replicas_part(
    fleet: ServerFleet,
    config: ReplicasConfig,
    part: Part,
    names: Sequence[ReplicasClientName],
    *,
    kv_blocks: int,
    conversations: Sequence[Conversation],
) -> list[ReplicasRun]:
    """Each client in turn over the same replicas, their prefix caches emptied before
    each (the admin endpoint's reset, as vLLM's ``POST /reset_prefix_cache``)."""
    replicas = await asyncio.gather(
        *(
            fleet.start(
                f"{part}-r{i}",
                "--num-kv-blocks",
                str(kv_blocks),
                "--seed",
                str(config.seed),
                admin=True,
            )
            for i in range(config.replicas)
        )
    )
    try:
        runs = []
        for name in names:
            await _reset(replicas)
            runs.append(await _pairing(config, part, name, replicas, conversations))
        return runs
    finally:
        for replica in replicas:
            fleet.stop(replica)


async def _pairing(
    config: ReplicasConfig,
    part: Part,
    name: ReplicasClientName,
    replicas: Sequence[ServerProcess],
    conversations: Sequence[Conversation],
) -> ReplicasRun:
    """One client through one part, the replicas' counters read before and after."""
    client = make_replicas_client(name, [r.base_url for r in replicas], config.deadline_s)
    try:
        before = [await _counters(r) for r in replicas]
        run = ReplicasRun(part, name, [], [])
        if part == "affinity":
            await _conversations(config, client, conversations, run)
        else:
            await _hedging(config, client, replicas, run)
        await _idle(replicas)
        after = [await _counters(r) for r in replicas]
        run.replicas = [
            {key: a[key] - b[key] for key in a} for a, b in zip(after, before, strict=True)
        ]
        run.client_stats = client.stats()
        run.calls.sort(key=lambda c: c.start_s)
        return run
    finally:
        await client.aclose()


async def _timed(
    config: ReplicasConfig,
    client: ReplicasClient,
    messages: list[dict[str, str]],
    key: str | None,
    t0: float,
    run: ReplicasRun,
) -> None:
    """One call within the caller's deadline, recorded."""
    started = time.monotonic()
    try:
        outcome = await asyncio.wait_for(
            client.call(messages, config.max_tokens, key), config.deadline_s
        )
        ok, first, error = outcome.ok, outcome.first_token_at, outcome.error
    except asyncio.TimeoutError:
        ok, first, error = False, None, "deadline"
    ended = time.monotonic()
    run.calls.append(
        CallRecord(
            start_s=started - t0,
            latency_s=ended - started,
            ttft_s=None if first is None else first - started,
            ok=ok and first is not None,
            error=error if ok or error else "no chunk",
        )
    )


async def _conversations(
    config: ReplicasConfig,
    client: ReplicasClient,
    conversations: Sequence[Conversation],
    run: ReplicasRun,
) -> None:
    """Every turn of every conversation, at most ``in_flight`` at once: the first turns
    in a seeded order, each conversation's next turn queued at the back when its turn
    ends (failed or not: the history is the workload's own), as bench_affinity.py."""
    queue: asyncio.Queue[tuple[Conversation, int] | None] = asyncio.Queue()
    order = list(conversations)
    random.Random(config.seed).shuffle(order)
    for conversation in order:
        queue.put_nowait((conversation, 0))
    left = sum(len(c.users) for c in conversations)
    t0 = time.monotonic()

    async def worker() -> None:
        nonlocal left
        while (job := await queue.get()) is not None:
            conversation, turn = job
            messages = conversation.messages(turn)
            await _timed(config, client, messages, conversation.id, t0, run)
            left -= 1
            if turn + 1 < len(conversation.users):
                queue.put_nowait((conversation, turn + 1))
            if left == 0:
                for _ in range(config.in_flight):
                    queue.put_nowait(None)

    await asyncio.gather(*(worker() for _ in range(config.in_flight)))


def hedging_prompts(config: ReplicasConfig) -> list[str]:
    """The hedging part's prompts, seeded and distinct (no prefix cache serves them)."""
    rng = random.Random(config.seed)
    count = round(config.rate * config.hedge_s)
    words = config.prompt_words
    return [
        f"call {i}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) for i in range(count)
    ]


async def _hedging(
    config: ReplicasConfig,
    client: ReplicasClient,
    replicas: Sequence[ServerProcess],
    run: ReplicasRun,
) -> None:
    """Calls at ``rate`` a second, evenly spaced, each awaited; the last replica slow
    during [slow_from_s, slow_until_s)."""
    t0 = time.monotonic()
    slow = asyncio.create_task(_slow_window(config, replicas[-1], t0, run.fault_errors))

    async def one(index: int, prompt: str) -> None:
        await asyncio.sleep(max(0.0, t0 + index / config.rate - time.monotonic()))
        await _timed(config, client, [{"role": "user", "content": prompt}], None, t0, run)

    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(hedging_prompts(config))))
    finally:
        slow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slow


async def _slow_window(
    config: ReplicasConfig, replica: ServerProcess, t0: float, errors: list[str]
) -> None:
    """The replica's first token ``slow_ms`` later during the window, then as before."""
    steps = ((config.slow_from_s, config.slow_ms), (config.slow_until_s, 0.0))
    async with httpx.AsyncClient(timeout=5.0) as http:
        for at, added_ms in steps:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            try:
                response = await http.post(
                    replica.admin_url("/admin/faults"),
                    json={"added_latency_ms": added_ms},
                    headers=replica.admin_headers,
                )
                response.raise_for_status()
            except httpx.HTTPError as exc:
                errors.append(f"{at:.1f}s: {type(exc).__name__}: {exc}")


async def _scrape(replica: ServerProcess) -> dict[str, float]:
    """Every sample of the replica's /metrics, summed over labels."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        response = await http.get(f"{replica.root}/metrics")
        response.raise_for_status()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def _counters(replica: ServerProcess) -> dict[str, float]:
    values = await _scrape(replica)
    return {key: values.get(series, 0.0) for key, series in COUNTERS}


async def _reset(replicas: Sequence[ServerProcess]) -> None:
    """Every replica's prefix cache emptied (each is idle: the previous client's calls
    have ended, ``_idle``)."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        for replica in replicas:
            response = await http.post(
                replica.admin_url("/admin/reset_prefix_cache"),
                json={},
                headers=replica.admin_headers,
            )
            response.raise_for_status()
            if not response.json().get("reset"):
                raise RuntimeError(f"{replica.name}: its prefix cache was not reset (busy)")


async def _idle(replicas: Sequence[ServerProcess]) -> None:
    """Until no replica serves a request (a hedge's loser or a call the caller left is
    counted when the server has ended it), or ``_IDLE_TIMEOUT_S``."""
    deadline = time.monotonic() + _IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        # The scrape itself is one request in flight.
        busy = [(await _scrape(r)).get(_IN_FLIGHT, 0.0) > 1 for r in replicas]
        if not any(busy):
            return
        await asyncio.sleep(0.05)
