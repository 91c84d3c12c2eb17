"""bench/bench_affinity.py without vLLM: its workload, its driver and its arithmetic.

The benchmark's figures are only as good as these: every client must send the same
prompts, each turn must extend its conversation's previous turn (else no cache could
serve it), a derived affinity key must stay the same over a conversation's turns, and
the prefill, balance and target figures must be the arithmetic the docs state.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import bench_affinity as ba
from stormguard import AffinityPolicy

SHAPE = ba.Shape(conversations=6, tenants=2, turns=4, system_words=50, user_words=8, reply_words=5)

METRICS = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 9054.0
vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.79e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 5952.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 9054.0
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 3102.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_cache_hit"} 5952.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 7.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 0.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 1.0
"""


def test_the_workload_is_the_same_for_a_seed_and_another_for_another_seed() -> None:
    assert ba.build_conversations(SHAPE, 7) == ba.build_conversations(SHAPE, 7)
    assert ba.build_conversations(SHAPE, 7) != ba.build_conversations(SHAPE, 8)


def test_a_tenants_conversations_share_its_system_prompt_and_nothing_else() -> None:
    conversations = ba.build_conversations(SHAPE, 1)
    assert len(conversations) == 6
    assert len({c.id for c in conversations}) == 6
    for c in conversations:
        same = [o for o in conversations if o.tenant == c.tenant]
        assert len(same) == 3
        assert {o.system for o in same} == {c.system}
        assert len(c.system.split()) == 2 + 50  # "tenant N:" and its words
    assert len({c.system for c in conversations}) == 2
    assert len({c.users[0] for c in conversations}) == 6


def test_each_turn_sends_the_previous_turn_whole_then_its_reply_and_a_new_question() -> None:
    conv = ba.build_conversations(SHAPE, 3)[0]
    first = conv.messages(0)
    assert [m["role"] for m in first] == ["system", "user"]
    for turn in range(1, SHAPE.turns):
        before, now = conv.messages(turn - 1), conv.messages(turn)
        assert now[: len(before)] == before
        assert now[len(before) :] == [
            {"role": "assistant", "content": conv.replies[turn - 1]},
            {"role": "user", "content": conv.users[turn]},
        ]
        assert len(now[-1]["content"].split()) == 8


def test_a_derived_key_is_one_per_conversation_over_all_its_turns() -> None:
    """What sg-derived relies on: the prompt's start through the first user message
    is the same on every turn, and differs between the conversations of one tenant."""
    policy = AffinityPolicy(derive_from_prompt=True)
    conversations = ba.build_conversations(SHAPE, 5)
    keys = []
    for conv in conversations:
        turns = {policy.key_of({"messages": conv.messages(t)}) for t in range(SHAPE.turns)}
        assert len(turns) == 1 and None not in turns
        keys.append(turns.pop())
    assert len(set(keys)) == len(conversations)


def test_distinct_tokens_count_a_tenants_system_prompt_once() -> None:
    conversations = ba.build_conversations(SHAPE, 2)

    def words(messages: list[Any]) -> int:
        return sum(len(m["content"].split()) + 1 for m in messages)  # +1: the role's token

    system = 52 + 1
    last_turn_rest = 4 * (8 + 1) + 3 * (5 + 1)  # 4 questions and 3 replies
    assert ba.distinct_tokens(conversations, words) == 2 * system + 6 * last_turn_rest


def test_counters_read_vllms_metrics_summed_over_their_labels() -> None:
    assert ba.counters(METRICS) == {
        "prompt": 9054.0,
        "hits": 5952.0,
        "queries": 9054.0,
        "computed": 3102.0,
        "requests": 9.0,
        "preempted": 1.0,
    }
    assert ba.metric(METRICS, "vllm:request_success_total", finished_reason="length") == 7.0
    assert ba.metric(METRICS, "vllm:no_such_metric") == 0.0


def test_delta_is_each_counter_after_less_before() -> None:
    assert ba.delta({"prompt": 10.0, "hits": 4.0}, {"prompt": 3.0}) == {"prompt": 7.0, "hits": 4.0}


def test_percentiles_are_inclusive_and_need_two_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert ba.percentile(values, 50) == pytest.approx(50.5)
    assert ba.percentile(values, 99) == pytest.approx(99.01)
    assert ba.percentile([5.0, 1.0], 99) <= 5.0  # never past the slowest
    assert ba.percentile([1.0], 50) is None


def test_max_share_is_the_busiest_replica_over_its_fair_share() -> None:
    assert ba.max_share([96.0, 96.0]) == 1.0
    assert ba.max_share([120.0, 72.0]) == 1.25
    assert ba.max_share([3.0, 1.0, 0.0, 0.0]) == 3.0
    assert ba.max_share([0.0, 0.0]) is None
    assert ba.max_share([]) is None


def test_moves_count_turns_on_another_replica_than_the_turn_before() -> None:
    served = {
        "a": ["1", "1", "2", "2"],  # one move of three
        "b": ["2", None, "1", "1"],  # only 1 -> 1 is known
        "c": ["1"],
    }
    assert ba.moves(served) == (1, 4)


def _run(
    client: str, computed: float, prompt: float, ttfts: list[float], requests: list[float]
) -> ba.Run:
    run = ba.Run(client=client, round=0, seed=1, turns=len(ttfts), wall_s=2.0, ttfts=ttfts)
    hits = prompt - computed
    run.replicas = [
        {"prompt": prompt / 2, "hits": hits / 2, "requests": r, "preempted": 0.0} for r in requests
    ]
    return run


def test_figures_give_the_cuts_against_the_baseline_and_the_verdicts() -> None:
    none = _run("sg-none", computed=1000.0, prompt=5000.0, ttfts=[0.1, 0.2, 0.3], requests=[2, 1])
    key = _run("sg-key", computed=550.0, prompt=5000.0, ttfts=[0.05, 0.1, 0.9], requests=[2, 1])
    figures = key.figures(none)
    assert figures["computed_tokens"] == 550.0
    assert figures["hit_rate"] == pytest.approx(0.89)
    assert figures["prefill_cut"] == pytest.approx(0.45)
    assert figures["ttft_p50_ms"] == pytest.approx(100.0)
    assert figures["ttft_p50_cut"] == pytest.approx(0.5)
    assert figures["turns_per_s"] == 1.5
    assert figures["max_share"] == pytest.approx(4 / 3)
    assert ba.verdicts(figures) == {"prefill": True, "ttft_p50": True, "balance": False}
    assert ba.verdicts(none.figures(None)) == {"prefill": None, "ttft_p50": None, "balance": False}


def test_the_targets_hold_at_their_exact_values() -> None:
    figures = {"prefill_cut": 0.40, "ttft_p50_cut": 0.30, "max_share": 1.25}
    assert ba.verdicts(figures) == {"prefill": True, "ttft_p50": True, "balance": True}
    figures = {"prefill_cut": 0.39, "ttft_p50_cut": 0.29, "max_share": 1.26}
    assert ba.verdicts(figures) == {"prefill": False, "ttft_p50": False, "balance": False}


def test_the_driver_runs_every_turn_in_order_within_its_bound_and_counts_failures() -> None:
    conversations = ba.build_conversations(SHAPE, 4)
    seen: dict[str, list[int]] = {}
    running = peak = 0

    async def call(conv: ba.Conversation, turn: int, messages: list[dict[str, Any]]) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0)
            assert messages == conv.messages(turn)
            seen.setdefault(conv.id, []).append(turn)
            if conv.id.endswith("c0") and turn == 1:
                raise ConnectionError("refused")
            return 0.01, "1", False
        finally:
            running -= 1

    run = ba.Run(client="fake", round=0, seed=4)
    asyncio.run(ba.drive(call, conversations, in_flight=3, seed=4, run=run))
    assert seen == {c.id: [0, 1, 2, 3] for c in conversations}
    assert peak == 3
    assert run.turns == 24 and run.failures == 1
    assert run.errors == ["ConnectionError: refused"]
    assert len(run.ttfts) == 23
    assert run.served[conversations[0].id] == ["1", None, "1", "1"]
    assert run.wall_s > 0


def test_an_open_loop_starts_turns_at_its_rate_however_many_are_in_flight() -> None:
    conversations = ba.build_conversations(SHAPE, 4)
    seen: dict[str, list[int]] = {}
    running = peak = 0
    release = asyncio.Event()

    async def call(conv: ba.Conversation, turn: int, messages: list[dict[str, Any]]) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            assert messages == conv.messages(turn)
            seen.setdefault(conv.id, []).append(turn)
            if running == len(conversations):  # every first turn is in flight at once
                release.set()
            await release.wait()
            return 0.01, "1", False
        finally:
            running -= 1

    run = ba.Run(client="fake", round=0, seed=4)
    asyncio.run(ba.drive(call, conversations, in_flight=2, seed=4, run=run, rate=10_000.0))
    assert seen == {c.id: [0, 1, 2, 3] for c in conversations}  # each in order
    assert peak == len(conversations)  # not held to ``in_flight``
    assert run.turns == 24 and run.failures == 0 and len(run.ttfts) == 24


def test_the_floor_counts_what_a_never_evicting_prefix_cache_must_compute() -> None:
    block = 4
    first = list(range(10))  # 10 tokens: nothing cached yet
    again = list(range(10))  # all 2 full blocks cached; the last token is computed anyway
    longer = [*range(10), 50, 51, 52, 53, 54]  # 2 blocks (8 tokens) cached of 15
    exact = list(range(8))  # its 2 blocks are cached, but the last is never a hit: 4 of 8
    other = [99, *range(1, 10)]  # differs in the first block: nothing cached
    requests = [(0, first), (0, again), (0, longer), (0, exact), (0, other), (1, first)]
    assert ba.prefix_cache_floor(requests, block) == 10 + 2 + 7 + 4 + 10 + 10


def test_the_affinity_floor_keeps_a_conversation_on_one_replica() -> None:
    conversations = ba.build_conversations(SHAPE, 6)
    ids_of: dict[str, int] = {}

    def ids(messages: list[Any]) -> list[int]:  # a token per word, the same word the same id
        words = " ".join(m["content"] for m in messages).split()
        return [ids_of.setdefault(w, len(ids_of)) for w in words]

    floor = ba.affinity_floor(conversations, ids, seed=6)
    every = sum(len(ids(c.messages(t))) for c in conversations for t in range(SHAPE.turns))
    # Each later turn re-sends the earlier ones: most of every prompt is cached.
    assert 0 < floor < every / 2
    assert floor == ba.affinity_floor(conversations, ids, seed=6)
    # Over three replicas a tenant's system prompt is computed on up to three; on one
    # replica every prefix is computed once, the least any split can do.
    three = ba.affinity_floor(conversations, ids, seed=6, replicas=3)
    assert ba.affinity_floor(conversations, ids, seed=6, replicas=1) <= min(floor, three)
    assert 0 < three < every / 2


def test_each_stormguard_client_has_its_affinity() -> None:
    assert ba.sg_affinity("sg-none", 0.25, 2) is None
    assert ba.sg_affinity("sg-key", 0.5, 0) == AffinityPolicy(epsilon=0.5, slack=0)
    assert ba.sg_affinity("sg-derived", 0.25, 3) == AffinityPolicy(
        epsilon=0.25, slack=3, derive_from_prompt=True
    )
    assert ba.DEFAULT_SLACK == AffinityPolicy().slack == 2


def test_the_kv_cache_is_sized_from_the_models_own_shape(tmp_path: Any) -> None:
    import json

    import vllm_bench

    def bytes_per_token(**config: int) -> int:
        (tmp_path / "config.json").write_text(json.dumps(config))
        return vllm_bench.kv_bytes_per_token(str(tmp_path))

    # The tiny model: 2 (K, V) x 2 layers x 4 heads x 32 dimensions x 2 bytes (bf16).
    assert bytes_per_token(hidden_size=128, num_attention_heads=4, num_hidden_layers=2) == 1024
    # A larger one built by ``tiny_model --hidden-size 512 --layers 4``; grouped KV heads.
    larger = {"hidden_size": 512, "num_attention_heads": 16, "num_hidden_layers": 4}
    assert bytes_per_token(**larger) == 8192
    assert bytes_per_token(**larger, num_key_value_heads=4) == 2048
