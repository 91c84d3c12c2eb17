"""``stormguard-drill --scenario replicas``: every part's pairings, the JSON document.

The scenario, its parts and figures: the package's doc (``stormguard_drill.replicas``)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stormguard_drill.clients.litellm_client import import_litellm
from stormguard_drill.replicas.clients import (
    PART_CLIENTS,
    REPLICAS_CLIENT_TITLES,
    ReplicasClientName,
)
from stormguard_drill.replicas.config import PARTS, REPLICA_ENGINE_ARGS, ReplicasConfig
from stormguard_drill.replicas.conversations import (
    Conversation,
    build_conversations,
    distinct_tokens,
)
from stormguard_drill.replicas.runner import run_replicas_part
from stormguard_drill.replicas.summary import check_targets, summarize_replicas
from stormguard_drill.report import load_average, machine, source
from stormguard_drill.servers import EngineSpec, ServerFleet
from stormguard_server.engine import tokenizer

_BLOCK_SIZE = 16


def prompt_tokens(messages: list[Any]) -> int:
    """Tokens of a list of chat messages as the sim server renders them."""
    pairs = [(m["role"], m["content"]) for m in messages]
    return tokenizer.count_tokens(tokenizer.apply_chat_template(pairs))


def kv_blocks(config: ReplicasConfig, conversations: list[Conversation]) -> dict[str, int]:
    """Each replica's KV cache: ``kv_share`` of all the conversations' distinct prompt
    tokens, and never less than the longest turns of its share of the calls in flight,
    a quarter above even (affinity's bound on a replica's load): a replica that cannot
    hold the turns it runs preempts them, which is another test."""
    working = distinct_tokens(conversations, prompt_tokens)
    longest = max(prompt_tokens(c.messages(len(c.users) - 1)) for c in conversations)
    running = math.ceil(config.in_flight * 1.25 / config.replicas)
    tokens = max(int(working * config.kv_share), running * (longest + config.max_tokens))
    return {
        "working_set_tokens": working,
        "longest_prompt_tokens": longest,
        "kv_blocks": -(-tokens // _BLOCK_SIZE),
    }


async def replicas_drill(
    config: ReplicasConfig,
    out: Path,
    clients: list[ReplicasClientName],
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole replicas drill, one pairing at a time (they time the first token), each
    part on its own replicas; returns the JSON document."""
    if "litellm-router" in clients:
        import_litellm()
    started = time.monotonic()
    host = machine()
    code = source()
    conversations = build_conversations(config.shape, config.seed)
    sizing = kv_blocks(config, conversations)
    pairings: list[dict[str, Any]] = []
    async with ServerFleet(out / "logs", EngineSpec(args=REPLICA_ENGINE_ARGS)) as fleet:
        for part in PARTS:
            names = [name for name in PART_CLIENTS[part] if name in clients]
            if not names:
                continue
            runs = await run_replicas_part(
                fleet,
                config,
                part,
                names,
                kv_blocks=sizing["kv_blocks"],
                conversations=conversations,
            )
            pairings += [summarize_replicas(run, config) for run in runs]
    return {
        "scenario": config.scenario,
        "mode": config.mode,
        "seed": config.seed,
        "engine": "sim",
        "config": {k: v for k, v in asdict(config).items() if k != "targets"},
        "sizing": sizing,
        "clients": {c: REPLICAS_CLIENT_TITLES[c] for c in clients},
        "targets": asdict(config.targets),
        "targets_checked": check_targets(pairings, config),
        "skipped": skipped or {},
        "machine": {**host, "load_average_at_end": load_average()},
        "source": code,
        "wall_time_s": round(time.monotonic() - started, 1),
        "pairings": pairings,
    }
