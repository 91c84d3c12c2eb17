"""The scheduler step by step: token budget, batch bound, prefill then decode,
preemption or OOM when blocks run out."""

from __future__ import annotations

import pytest

from stormguard_server.engine.base import GenerationRequest
from stormguard_server.engine.kv_cache import BlockAllocator
from stormguard_server.engine.scheduler import (
    KVExhausted,
    Scheduler,
    SequenceState,
    natural_output_tokens,
)


def seq(name: str, prompt: int, output: int) -> SequenceState:
    request = GenerationRequest(
        request_id=name, prompt=name, prompt_tokens=prompt, max_tokens=output, ignore_eos=True
    )
    return SequenceState(request=request, target_output_tokens=output)


def make(
    blocks: int = 64, *, seqs: int = 4, tokens: int = 64, oom_crash: bool = False
) -> Scheduler:
    return Scheduler(
        BlockAllocator(blocks, 16),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        oom_crash=oom_crash,
    )


def run_step(scheduler: Scheduler) -> list[str]:
    plan = scheduler.schedule()
    sampled = Scheduler.complete(plan)
    for s in sampled:
        if s.is_done:
            scheduler.finish(s)
    return [s.request_id for s in sampled]


def test_prefill_is_chunked_by_the_token_budget_then_decodes_one_token_per_step() -> None:
    scheduler = make(tokens=64)
    a = seq("a", prompt=100, output=3)
    scheduler.add(a)
    plan = scheduler.schedule()
    assert plan.work == [(a, 64)] and plan.prefill_tokens == 64
    assert Scheduler.complete(plan) == []  # prefill not finished: nothing sampled
    plan = scheduler.schedule()
    assert plan.work == [(a, 36)]
    assert Scheduler.complete(plan) == [a]  # end of prefill samples the first token
    plan = scheduler.schedule()
    assert plan.work == [(a, 1)] and plan.num_decode == 1
    Scheduler.complete(plan)
    assert run_step(scheduler) == ["a"]
    assert a.is_done and not scheduler.running
    assert scheduler.allocator.num_free_blocks == 64


def test_running_batch_is_bounded_by_max_num_seqs() -> None:
    scheduler = make(seqs=2, tokens=1000)
    for name in "abc":
        scheduler.add(seq(name, prompt=10, output=5))
    plan = scheduler.schedule()
    assert [s.request_id for s, _ in plan.work] == ["a", "b"]
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_seq_limit_shrinks_the_batch_during_slow_start() -> None:
    scheduler = make(seqs=4, tokens=1000)
    for name in "abcd":
        scheduler.add(seq(name, prompt=10, output=5))
    plan = scheduler.schedule(seq_limit=1)
    assert len(plan.work) == 1 and len(scheduler.waiting) == 3


def test_waiting_request_that_does_not_fit_waits_in_preempt_mode() -> None:
    scheduler = make(blocks=4, tokens=1000)  # 64 slots
    scheduler.add(seq("a", prompt=40, output=2))
    scheduler.add(seq("b", prompt=40, output=2))
    plan = scheduler.schedule()
    assert [s.request_id for s, _ in plan.work] == ["a"]
    assert [s.request_id for s in scheduler.waiting] == ["b"]


def test_preemption_evicts_the_newest_and_recomputes_it() -> None:
    scheduler = make(blocks=2, tokens=1000)  # 32 slots
    a, b = seq("a", prompt=16, output=10), seq("b", prompt=15, output=10)
    scheduler.add(a)
    scheduler.add(b)
    Scheduler.complete(scheduler.schedule())  # both prefilled, one token sampled each
    assert scheduler.allocator.num_free_blocks == 0
    plan = scheduler.schedule()  # a's next token needs a 2nd block: b, the newest, goes
    assert plan.preempted == [b]
    assert plan.work == [(a, 1)]
    assert b.num_computed == 0 and scheduler.waiting[0] is b
    assert b.output_tokens == 1  # its output is kept and will be prefilled again
    assert b.known_tokens == 16 and b.is_prefilling
    Scheduler.complete(plan)
    # Nothing new is admitted in a step that preempted; b runs again once blocks free up.
    while scheduler.running:
        run_step(scheduler)
    assert run_step(scheduler) == ["b"]  # recompute prefill of prompt + output so far


def test_oom_mode_crashes_where_vllm_would_preempt() -> None:
    scheduler = make(blocks=2, tokens=1000, oom_crash=True)
    scheduler.add(seq("a", prompt=16, output=10))
    scheduler.add(seq("b", prompt=15, output=10))
    Scheduler.complete(scheduler.schedule())
    with pytest.raises(KVExhausted):
        scheduler.schedule()


def test_oom_mode_starts_a_long_prompt_without_checking_and_crashes() -> None:
    scheduler = make(blocks=4, tokens=1000, oom_crash=True)
    scheduler.add(seq("long", prompt=100, output=1))
    with pytest.raises(KVExhausted):
        scheduler.schedule()


def test_abort_and_drain_free_everything() -> None:
    scheduler = make()
    scheduler.add(seq("a", prompt=20, output=5))
    scheduler.add(seq("b", prompt=20, output=5))
    scheduler.schedule(seq_limit=1)
    assert scheduler.abort("a") is not None
    assert scheduler.abort("nope") is None
    assert scheduler.allocator.num_free_blocks == 64
    assert [s.request_id for s in scheduler.drain_all()] == ["b"]
    assert not scheduler.waiting and not scheduler.running


def test_finish_requests_takes_them_from_batch_and_queue_in_one_call() -> None:
    scheduler = make(seqs=2)
    for name in ("run-1", "run-2", "wait-1", "wait-2"):
        scheduler.add(seq(name, prompt=20, output=5))
    scheduler.schedule()
    assert [s.request_id for s in scheduler.running] == ["run-1", "run-2"]
    held = scheduler.allocator.num_free_blocks
    finished = scheduler.finish_requests({"run-2", "wait-1", "unknown"})
    assert sorted(s.request_id for s in finished) == ["run-2", "wait-1"]
    assert [s.request_id for s in scheduler.running] == ["run-1"]
    assert [s.request_id for s in scheduler.waiting] == ["wait-2"]
    assert scheduler.allocator.num_free_blocks == held + 2  # run-2's 20 slots: 2 blocks
    assert scheduler.finish_requests(set()) == []


def test_natural_length_is_stable_and_bounded() -> None:
    request = GenerationRequest(request_id="x", prompt="hello", prompt_tokens=1, max_tokens=1000)
    length = natural_output_tokens(request, 64)
    assert 32 <= length < 96
    assert natural_output_tokens(request, 64) == length
    short = GenerationRequest(request_id="y", prompt="hello", prompt_tokens=1, max_tokens=5)
    assert natural_output_tokens(short, 64) == 5
