"""The replicas scenario's knobs: the replicas' engine, the two parts' loads (the
conversations of the affinity part, the calls and the slow window of the hedging
part), the clients' patience, the targets; the presets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stormguard_drill.config import ENGINE_STEPS, Mode
from stormguard_drill.replicas.conversations import ConversationShape

Part = Literal["affinity", "hedging"]
PARTS: tuple[Part, ...] = ("affinity", "hedging")

#: The sim engine of every replica, besides its KV size: prefix caching on; prefill
#: costs 200 us a token (ten times the server's default), so that a prompt of ~700
#: tokens takes ~0.14 s to prefill and a cache hit shows in the time to first token,
#: as on a real engine; vLLM's preemption rather than an OOM crash when the cache is
#: full (the scenario is about routing, not about the avalanche); steps as the drill's.
REPLICA_ENGINE_ARGS: tuple[str, ...] = (
    "--prefix-caching",
    "--no-oom",
    *ENGINE_STEPS,
    "--prefill-token-us",
    "200",
)


FULL_SHAPE = ConversationShape(
    conversations=38, tenants=6, turns=6, system_words=600, user_words=60, reply_words=30
)
QUICK_SHAPE = ConversationShape(
    conversations=14, tenants=4, turns=4, system_words=400, user_words=80, reply_words=40
)


@dataclass(frozen=True, slots=True)
class ReplicasTargets:
    """The scenario's claims, checked on stormguard's rows."""

    #: The affinity row computes at most this share of the default row's prefill tokens.
    max_affinity_prefill_ratio: float = 1.0
    #: The hedging row's TTFT p99 below the default row's, times this.
    max_hedge_p99_ratio: float = 1.0
    max_hedge_attempts_per_call: float = 1.1
    min_success: float = 1.0


@dataclass(frozen=True, slots=True)
class ReplicasConfig:
    """One replicas drill: both parts' loads, the replicas, the clients' patience."""

    mode: Mode
    seed: int = 0
    replicas: int = 3
    # Affinity: the conversations, how many turns run at once, and each replica's KV
    # cache as a share of all the conversations' distinct prompt tokens: about what one
    # replica needs when each conversation stays on one replica (every system prompt
    # and a third of the rest), half of what each needs when they scatter.
    shape: ConversationShape = FULL_SHAPE
    in_flight: int = 9
    kv_share: float = 0.5
    # Hedging: short streamed calls at ``rate`` a second for ``hedge_s``; one replica
    # answers its first token ``slow_ms`` later during [slow_from_s, slow_until_s).
    rate: float = 15.0
    hedge_s: float = 40.0
    slow_from_s: float = 15.0
    slow_until_s: float = 25.0
    slow_ms: float = 1500.0
    prompt_words: int = 40
    max_tokens: int = 16
    # The caller gives up on a call after this long.
    deadline_s: float = 10.0
    targets: ReplicasTargets = field(default_factory=ReplicasTargets)
    scenario: str = "replicas"


def replicas_preset(mode: Mode, *, seed: int = 0) -> ReplicasConfig:
    """The full run (~3 minutes), ``--quick`` (about a minute; the drill test's)."""
    if mode == "full":
        return ReplicasConfig(mode, seed=seed)
    return ReplicasConfig(
        mode,
        seed=seed,
        shape=QUICK_SHAPE,
        in_flight=6,
        hedge_s=10.0,
        slow_from_s=5.0,
        slow_until_s=8.0,
    )
