"""Continuous-batching scheduler of the sim engine, modelled on vLLM v1's.

Pure and synchronous (no clock, no asyncio), so it is tested step by step.
Each ``schedule()`` spends one token budget: running sequences first (one
token each when decoding, a chunk when prefilling), then waiting sequences
in arrival order while the batch has room. KV slots come from the
``BlockAllocator``; when they do not fit, the *scheduler* decides:

- ``oom_crash=False``: vLLM's recompute preemption. The newest running
  sequence loses its blocks and goes back to the front of the queue; when it
  runs again its prompt and output so far are prefilled anew.
- ``oom_crash=True``: the engine "runs out of memory". Like an engine that
  trusts its memory profile, it starts waiting sequences without checking
  that they will fit, and any allocation that fails raises ``KVExhausted``;
  the engine turns that into a crash: the OOM avalanche's crash.

With ``prefix_caching``, a sequence entering the batch first takes the cached
blocks its prompt starts with (vLLM's ``get_computed_blocks``): only the rest is
prefilled, and at least its last token is computed, since sampling needs it. Its
full blocks are offered to the cache as soon as their slots are reserved.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from stormguard_server.engine.base import GenerationRequest
from stormguard_server.engine.kv_cache import BlockAllocator


class KVExhausted(Exception):
    """An allocation did not fit and the policy is to crash (OOM mode)."""


@dataclass(eq=False)
class SequenceState:
    """A request inside the scheduler; identity is the object itself."""

    request: GenerationRequest
    # Output tokens to produce before EOS (max_tokens, or the natural length).
    target_output_tokens: int
    num_computed: int = 0
    output_tokens: int = 0
    text_seed: int = 0
    # Chained hashes of the prompt's full blocks (prefix_cache.block_hashes); None
    # when the prompt is neither looked up nor cached (the warm-up probe).
    block_hashes: tuple[int, ...] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def known_tokens(self) -> int:
        """Prompt plus output so far: what must be in the KV cache to sample next."""
        return self.request.prompt_tokens + self.output_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.known_tokens - self.num_computed > 1 or self.output_tokens == 0

    @property
    def is_done(self) -> bool:
        return self.output_tokens >= self.target_output_tokens


def natural_output_tokens(request: GenerationRequest, natural: int) -> int:
    """Output length without ignore_eos: stable per prompt, natural/2 .. 1.5*natural;
    a scripted output's length is its script's (its last token is the EOS)."""
    if request.script is not None:
        return max(1, min(request.max_tokens, len(request.script)))
    if request.ignore_eos:
        return request.max_tokens
    spread = max(1, natural)
    length = natural // 2 + zlib.crc32(request.prompt.encode("utf-8", "surrogatepass")) % spread
    return max(1, min(request.max_tokens, length))


@dataclass
class StepPlan:
    """What one engine step computes: (sequence, tokens) pairs, and who was preempted."""

    work: list[tuple[SequenceState, int]] = field(default_factory=list)
    preempted: list[SequenceState] = field(default_factory=list)
    # Prefix-cache lookups of the sequences that entered the batch, in tokens, as
    # vLLM counts them: their tokens queried, and those found cached.
    cache_queries: int = 0
    cache_hits: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.work

    @property
    def prefill_tokens(self) -> int:
        return sum(n for seq, n in self.work if seq.is_prefilling)

    @property
    def num_decode(self) -> int:
        return sum(1 for seq, _ in self.work if not seq.is_prefilling)


class Scheduler:
    """Running batch bounded by ``max_num_seqs`` and ``max_num_batched_tokens``."""

    def __init__(
        self,
        allocator: BlockAllocator,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        oom_crash: bool,
        prefix_caching: bool = False,
    ) -> None:
        self.allocator = allocator
        self.prefix_caching = prefix_caching
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.oom_crash = oom_crash
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []

    def add(self, seq: SequenceState) -> None:
        """Queue a new sequence (FIFO)."""
        self.waiting.append(seq)

    def finish_requests(self, request_ids: Collection[str]) -> list[SequenceState]:
        """Remove these sequences wherever they are and free their blocks; returns
        the ones found. The one way out of the batch for a sequence that did not
        complete (aborted by its caller, or past its deadline), as vLLM's
        ``finish_requests``: one pass over the batch and the queue for all of them."""
        if not request_ids:
            return []
        found = [seq for seq in self.running if seq.request_id in request_ids]
        if found:
            self.running = [seq for seq in self.running if seq.request_id not in request_ids]
        if len(found) < len(request_ids):
            queued = [seq for seq in self.waiting if seq.request_id in request_ids]
            if queued:
                self.waiting = deque(s for s in self.waiting if s.request_id not in request_ids)
                found += queued
        for seq in found:
            self.allocator.free(seq)
        return found

    def abort(self, request_id: str) -> SequenceState | None:
        """Remove one sequence wherever it is and free its blocks."""
        found = self.finish_requests({request_id})
        return found[0] if found else None

    def finish(self, seq: SequenceState) -> None:
        """A running sequence is done: free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        self.allocator.free(seq)

    def drain_all(self) -> list[SequenceState]:
        """Every sequence, running and waiting, removed (the engine crashed)."""
        every = [*self.running, *self.waiting]
        for seq in every:
            self.allocator.free(seq)
        self.running.clear()
        self.waiting.clear()
        return every

    def schedule(self, seq_limit: int | None = None) -> StepPlan:
        """Plan one step; raises ``KVExhausted`` in OOM mode when slots do not fit."""
        limit = (
            self.max_num_seqs if seq_limit is None else max(1, min(seq_limit, self.max_num_seqs))
        )
        plan = StepPlan()
        budget = self.max_num_batched_tokens

        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            tokens = min(seq.known_tokens - seq.num_computed, budget)
            if self._reserve(seq, tokens, plan):
                self._offer_blocks(seq, seq.num_computed + tokens)
                plan.work.append((seq, tokens))
                budget -= tokens
                index += 1
            elif seq not in self.running:
                break  # it preempted itself: nothing newer is left to preempt

        if plan.preempted:
            # vLLM admits nothing new in a step that had to preempt.
            return plan

        while self.waiting and len(self.running) < limit and budget > 0:
            seq = self.waiting[0]
            cached = self._cached_prefix(seq)
            hit = len(cached) * self.allocator.block_size
            tokens = min(seq.known_tokens - hit, budget)
            if not self.oom_crash and not self.allocator.can_allocate(seq, tokens, cached):
                break  # it waits until blocks are freed
            if self.allocator.allocate(seq, tokens, cached) is None:
                raise KVExhausted(f"{seq.request_id}: {tokens} slots do not fit")
            seq.num_computed = hit
            if self.prefix_caching and seq.block_hashes is not None:
                plan.cache_queries += seq.known_tokens
                plan.cache_hits += hit
            self._offer_blocks(seq, hit + tokens)
            self.waiting.popleft()
            self.running.append(seq)
            plan.work.append((seq, tokens))
            budget -= tokens
        return plan

    def _cached_prefix(self, seq: SequenceState) -> list[int]:
        """The cached blocks ``seq`` starts with; never all of its tokens."""
        if not self.prefix_caching or seq.block_hashes is None:
            return []
        return self.allocator.find_cached(seq.block_hashes, seq.known_tokens - 1)

    def _offer_blocks(self, seq: SequenceState, computed_tokens: int) -> None:
        """Name the prompt's full blocks up to ``computed_tokens`` in the cache."""
        if self.prefix_caching and seq.block_hashes is not None:
            full = computed_tokens // self.allocator.block_size
            self.allocator.cache_blocks(seq, seq.block_hashes, full)

    def _reserve(self, seq: SequenceState, tokens: int, plan: StepPlan) -> bool:
        """Slots for a running sequence, preempting the newest ones if allowed."""
        while self.allocator.allocate(seq, tokens) is None:
            if self.oom_crash:
                raise KVExhausted(f"{seq.request_id}: {tokens} slots do not fit")
            victim = self.running.pop()
            self.allocator.free(victim)
            victim.num_computed = 0
            self.waiting.appendleft(victim)
            plan.preempted.append(victim)
            if victim is seq:
                return False
        return True

    @staticmethod
    def complete(plan: StepPlan) -> list[SequenceState]:
        """Apply a finished step; returns the sequences that sampled a new token."""
        sampled: list[SequenceState] = []
        for seq, tokens in plan.work:
            seq.num_computed += tokens
            if seq.num_computed >= seq.known_tokens:
                seq.output_tokens += 1
                sampled.append(seq)
        return sampled
