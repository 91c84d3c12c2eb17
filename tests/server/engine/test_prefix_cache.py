"""Automatic prefix caching in the sim engine, as vLLM's: a prompt's cached full blocks
are not prefilled again (at least one token always is), blocks are named by a hash
chained over their predecessors, freed blocks stay cached until evicted least recently
used first, a block in use is never evicted, and hits are counted in tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import generate_latest

from stormguard_server.config import SimEngineConfig
from stormguard_server.engine import tokenizer
from stormguard_server.engine.base import EngineLoad, EngineStats, GenerationRequest
from stormguard_server.engine.kv_cache import BlockAllocator
from stormguard_server.engine.prefix_cache import block_hashes, hash_block_tokens
from stormguard_server.engine.scheduler import Scheduler, SequenceState
from stormguard_server.engine.sim_engine import SimEngine
from stormguard_server.telemetry.metrics import ServerMetrics
from tests.server.engine.test_sim_engine import FAST, collect, started
from tests.server.fake_clock import FakeClock

BLOCK = 16


def seq(name: str, token_ids: Sequence[int], output: int = 2) -> SequenceState:
    request = GenerationRequest(
        request_id=name,
        prompt=name,
        prompt_tokens=len(token_ids),
        max_tokens=output,
        ignore_eos=True,
    )
    return SequenceState(
        request=request, target_output_tokens=output, block_hashes=block_hashes(token_ids, BLOCK)
    )


def make(blocks: int = 64, *, tokens: int = 512, caching: bool = True) -> Scheduler:
    return Scheduler(
        BlockAllocator(blocks, BLOCK),
        max_num_seqs=4,
        max_num_batched_tokens=tokens,
        oom_crash=False,
        prefix_caching=caching,
    )


def run(scheduler: Scheduler, *seqs: SequenceState) -> tuple[int, int, int]:
    """Run ``seqs`` to their end; (prefill tokens computed, cache queries, cache hits)."""
    prefill = queries = hits = 0
    for one in seqs:
        scheduler.add(one)
    while scheduler.running or scheduler.waiting:
        plan = scheduler.schedule()
        prefill += plan.prefill_tokens
        queries += plan.cache_queries
        hits += plan.cache_hits
        for sampled in Scheduler.complete(plan):
            if sampled.is_done:
                scheduler.finish(sampled)
    return prefill, queries, hits


def ids(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_a_repeated_prompt_computes_only_its_new_tail() -> None:
    scheduler = make()
    system = ids(0, 40)  # two full blocks and 8 tokens of a third
    assert run(scheduler, seq("first", system)) == (40, 40, 0)
    # The next turn: the same 40 tokens and 20 more. The two full blocks are hit; the
    # third (its 8 first tokens were never a full block) is computed again.
    assert run(scheduler, seq("next", system + ids(100, 20))) == (60 - 32, 60, 32)


def test_an_identical_prompt_still_computes_its_last_token() -> None:
    scheduler = make()
    prompt = ids(0, 48)  # exactly three blocks
    run(scheduler, seq("one", prompt))
    # All three are cached, but the last token must be computed to sample: the hit
    # stops one whole block short, as vLLM's (max_cache_hit_length = tokens - 1).
    assert run(scheduler, seq("two", prompt)) == (16, 48, 32)


def test_the_same_block_after_another_prefix_is_a_miss() -> None:
    scheduler = make()
    run(scheduler, seq("one", ids(0, 32) + ids(500, 16)))
    # Its second and third blocks' tokens again, after a different first block.
    other = ids(1000, 16) + ids(16, 16) + ids(500, 16) + [7]
    assert run(scheduler, seq("two", other)) == (49, 49, 0)
    assert hash_block_tokens(0, ids(0, 16)) != hash_block_tokens(1, ids(0, 16))


def test_off_it_looks_up_nothing() -> None:
    scheduler = make(caching=False)
    prompt = ids(0, 64)
    run(scheduler, seq("one", prompt))
    assert run(scheduler, seq("two", prompt)) == (64, 0, 0)


def test_freed_blocks_are_evicted_least_recently_used_first() -> None:
    # 6 blocks: two prompts of two blocks each stay cached once done (each also holds
    # a third block for its output token, freed without a hash).
    scheduler = make(blocks=6)
    old, recent = ids(0, 32), ids(200, 32)
    run(scheduler, seq("old", old, output=1))
    run(scheduler, seq("recent", recent, output=1))
    assert scheduler.allocator.num_cached_blocks == 4
    # A new prompt of four blocks takes the two free unhashed blocks first, then the two
    # least recently freed: "old"'s, last block first.
    run(scheduler, seq("new", ids(900, 63), output=1))
    assert run(scheduler, seq("recent again", [*recent, 1])) == (1, 33, 32)
    assert run(scheduler, seq("old again", [*old, 1]))[2] == 0


def test_blocks_in_use_are_never_evicted() -> None:
    kv = BlockAllocator(num_blocks=4, block_size=BLOCK)
    hashes = block_hashes(ids(0, 32), BLOCK)
    assert kv.allocate("a", 33) is not None  # three blocks
    kv.cache_blocks("a", hashes, 2)
    # "b" shares a's two cached blocks; one block is free.
    cached = kv.find_cached(hashes, 32)
    assert len(cached) == 2
    assert kv.allocate("b", 1, cached) is not None
    assert kv.num_free_blocks == 0
    kv.free("a")  # its cached blocks are still b's: not free, not evictable
    assert kv.num_free_blocks == 1
    assert kv.allocate("c", 32) is None  # does not fit rather than evict b's blocks
    assert kv.find_cached(hashes, 32) == cached
    kv.free("b")
    assert kv.num_free_blocks == 4
    assert kv.allocate("c", 64) is not None  # now they may go
    assert kv.find_cached(hashes, 32) == []


def test_reviving_a_free_cached_block_counts_against_the_free_ones() -> None:
    kv = BlockAllocator(num_blocks=3, block_size=BLOCK)
    hashes = block_hashes(ids(0, 32), BLOCK)
    kv.allocate("a", 32)
    kv.cache_blocks("a", hashes, 2)
    kv.free("a")
    cached = kv.find_cached(hashes, 32)
    # Two free cached blocks to revive plus two new ones: four, of three.
    assert not kv.can_allocate("b", 32, cached)
    assert kv.allocate("b", 32, cached) is None and kv.num_free_blocks == 3
    assert kv.allocate("b", 16, cached) is not None and kv.num_free_blocks == 0


async def test_the_engine_counts_queries_and_hits_in_tokens() -> None:
    clock = FakeClock()
    config = SimEngineConfig(**{**_fields(FAST), "max_model_len": 1024, "num_kv_blocks": 64})
    engine = await started(config, clock)
    try:
        system = " ".join(["word"] * 100)
        first = tokenizer.apply_chat_template([("system", system), ("user", "one")])
        second = tokenizer.apply_chat_template([("system", system), ("user", "two two")])
        for name, prompt in (("a", first), ("b", second)):
            n = tokenizer.count_tokens(prompt)
            request = GenerationRequest(
                request_id=name, prompt=prompt, prompt_tokens=n, max_tokens=2, ignore_eos=True
            )
            await clock.drive(collect(engine.generate(request)))
        stats = engine.stats
        n_first, n_second = tokenizer.count_tokens(first), tokenizer.count_tokens(second)
        assert stats.prefix_cache_queries == n_first + n_second
        shared = _common_prefix(tokenizer.encode(first), tokenizer.encode(second))
        assert stats.prefix_cache_hits == shared // BLOCK * BLOCK > 0
        # The warm-up probe's 16 tokens, then the two prompts less the hit.
        assert stats.prompt_tokens_computed == 16 + n_first + n_second - stats.prefix_cache_hits
    finally:
        await engine.stop()


def test_metrics_carry_vllms_names_and_the_servers_own() -> None:
    stats = EngineStats(prefix_cache_queries=120, prefix_cache_hits=96)
    load = EngineLoad(state="ready", kv_cache_usage=0.0, kv_capacity_tokens=1, running=0, waiting=0)
    metrics = ServerMetrics(lambda: load, lambda: stats, lambda: None)
    text = generate_latest(metrics.registry).decode()
    assert "vllm:prefix_cache_queries_total 120.0" in text
    assert "vllm:prefix_cache_hits_total 96.0" in text
    assert "stormguard_engine_prefix_cache_queries_total 120.0" in text
    assert "stormguard_engine_prefix_cache_hits_total 96.0" in text


def _fields(config: SimEngineConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_prompt_counted_from_other_text_is_not_cached() -> None:
    engine = SimEngine(SimEngineConfig())
    request = GenerationRequest(request_id="x", prompt="hello", prompt_tokens=900, max_tokens=1)
    assert engine._block_hashes(request) is None


async def test_a_reset_empties_the_cache_only_when_the_engine_is_idle() -> None:
    clock = FakeClock()
    engine = await started(FAST, clock)
    try:
        prompt = tokenizer.apply_chat_template([("user", " ".join(["word"] * 40))])
        n = tokenizer.count_tokens(prompt)

        def request(name: str) -> GenerationRequest:
            return GenerationRequest(
                request_id=name, prompt=prompt, prompt_tokens=n, max_tokens=2, ignore_eos=True
            )

        await clock.drive(collect(engine.generate(request("a"))))
        assert engine.allocator.num_cached_blocks > 0
        engine.scheduler.add(SequenceState(request=request("busy"), target_output_tokens=1))
        assert engine.reset_prefix_cache() is False  # a request is in the engine
        assert engine.allocator.num_cached_blocks > 0
        engine.scheduler.waiting.clear()
        assert engine.reset_prefix_cache() is True
        assert engine.allocator.num_cached_blocks == 0
        await clock.drive(collect(engine.generate(request("b"))))
        # The same prompt again, after the reset: nothing hit.
        assert (engine.stats.prefix_cache_queries, engine.stats.prefix_cache_hits) == (2 * n, 0)
    finally:
        await engine.stop()


async def test_a_prompt_the_api_just_counted_is_not_tokenized_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    engine = await started(FAST, clock)
    encoded: list[str] = []
    real = tokenizer.encode

    def counting(text: str) -> list[int]:
        encoded.append(text)
        return real(text)

    monkeypatch.setattr(tokenizer, "encode", counting)
    try:
        prompt = tokenizer.apply_chat_template([("user", "counted once " * 30)])
        n = len(engine.encode(prompt))  # what the API does to check the prompt's length
        request = GenerationRequest(
            request_id="a", prompt=prompt, prompt_tokens=n, max_tokens=2, ignore_eos=True
        )
        await clock.drive(collect(engine.generate(request)))
        assert encoded == [prompt]
        assert engine.stats.prefix_cache_queries >= n
    finally:
        await engine.stop()
