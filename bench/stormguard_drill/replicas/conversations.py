"""Multi-turn conversations over a few long shared system prompts: the workload of
prefix-cache affinity, on the sim engine (the replicas scenario) and on real vLLM
(``bench/bench_affinity.py`` imports it from here).

Each tenant has a system prompt its conversations share; each turn sends the whole
conversation so far (system prompt, earlier user messages and replies) plus a new
user message, so each turn's prompt starts with the previous turn's. The replies kept
in the history are the workload's own fixed text, not the model's, so every client
sends the very same prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConversationShape:
    """How many conversations, over how many tenants' system prompts, of what sizes."""

    conversations: int = 32
    tenants: int = 8
    turns: int = 6
    system_words: int = 700
    user_words: int = 60
    reply_words: int = 30


@dataclass(frozen=True)
class Conversation:
    """One chat: its tenant's system prompt, then a user message and a reply per turn."""

    id: str
    tenant: int
    system: str
    users: tuple[str, ...]
    replies: tuple[str, ...]

    def messages(self, turn: int) -> list[dict[str, str]]:
        """What turn ``turn`` (0-based) sends: the conversation so far and its new user
        message. Each turn's messages start with the previous turn's, whole."""
        messages = [{"role": "system", "content": self.system}]
        for earlier in range(turn):
            messages.append({"role": "user", "content": self.users[earlier]})
            messages.append({"role": "assistant", "content": self.replies[earlier]})
        messages.append({"role": "user", "content": self.users[turn]})
        return messages


def build_conversations(shape: ConversationShape, seed: int) -> list[Conversation]:
    """The workload of ``seed``: the same conversations in every process and client.
    Its words are those the tiny vLLM model's tokenizer knows (one token each there,
    and in the sim's tokenizer)."""
    from stormguard_server.vllm.tiny_model import _WORDS

    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(words))

    systems = [f"tenant {t}: " + text(shape.system_words) for t in range(shape.tenants)]
    conversations = []
    for number in range(shape.conversations):
        tenant = number % shape.tenants
        conversations.append(
            Conversation(
                id=f"s{seed}-c{number}",
                tenant=tenant,
                system=systems[tenant],
                users=tuple(text(shape.user_words) for _ in range(shape.turns)),
                replies=tuple(text(shape.reply_words) for _ in range(shape.turns)),
            )
        )
    return conversations


def distinct_tokens(
    conversations: Sequence[Conversation], count: Callable[[list[Any]], int]
) -> int:
    """Prompt tokens a cache must hold to keep every conversation's prefix at its last
    turn: each tenant's system prompt once, each conversation's rest once. ``count``
    gives the tokens of a list of messages as the server renders them."""
    systems = {c.tenant: count(c.messages(0)[:1]) for c in conversations}
    rests = (count(c.messages(len(c.users) - 1)) - systems[c.tenant] for c in conversations)
    return sum(systems.values()) + sum(rests)
