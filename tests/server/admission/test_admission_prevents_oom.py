"""Property: behind admission, the OOM-mode scheduler never runs out of KV blocks.

A discrete simulation without a clock: each step some requests arrive and
ask for admission; admitted ones enter the real scheduler over the real
allocator (OOM mode: any allocation that does not fit raises); finished ones
release their grant. Whatever the sizes, no step may raise KVExhausted.
Without admission the same arrivals do crash it (checked too, so the
property is not vacuous).
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stormguard_server.admission.controller import AdmissionController
from stormguard_server.admission.tickets import Grant, Ticket
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine.base import EngineLoad, GenerationRequest
from stormguard_server.engine.kv_cache import BlockAllocator
from stormguard_server.engine.scheduler import KVExhausted, Scheduler, SequenceState

BLOCKS, BLOCK_SIZE = 32, 16  # 512 slots
MAX_LEN = 400

request_sizes = st.tuples(st.integers(1, 300), st.integers(1, 100))
arrivals = st.lists(st.lists(request_sizes, max_size=6), min_size=1, max_size=40)


def run(steps: list[list[tuple[int, int]]], *, admission: bool) -> None:
    allocator = BlockAllocator(BLOCKS, BLOCK_SIZE)
    scheduler = Scheduler(allocator, max_num_seqs=8, max_num_batched_tokens=256, oom_crash=True)

    def load() -> EngineLoad:
        return EngineLoad(
            state="ready",
            kv_cache_usage=allocator.usage,
            kv_capacity_tokens=BLOCKS * BLOCK_SIZE,
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            kv_block_size=BLOCK_SIZE,
        )

    config = AdmissionConfig(kv_watermark=1.0, max_queue_requests=1000, max_queue_tokens=10**9)
    ctl = AdmissionController(config, load, clock=lambda: 0.0)
    grants: dict[str, Grant] = {}
    queued: list[tuple[Ticket, SequenceState]] = []
    counter = 0

    def start(seq: SequenceState, grant: Grant | None) -> None:
        if grant is not None:
            grants[seq.request_id] = grant
        scheduler.add(seq)

    def busy() -> bool:
        return bool(queued or grants or scheduler.running or scheduler.waiting)

    step = 0
    while step < len(steps) or (busy() and step < 100_000):  # then let everything drain
        arriving = steps[step] if step < len(steps) else []
        step += 1
        for prompt, max_tokens in arriving:
            max_tokens = min(max_tokens, MAX_LEN - prompt)
            counter += 1
            request = GenerationRequest(
                request_id=str(counter), prompt="p", prompt_tokens=prompt, max_tokens=max_tokens
            )
            seq = SequenceState(request=request, target_output_tokens=max_tokens)
            if not admission:
                start(seq, None)
                continue
            ticket = ctl.make_ticket(prompt + max_tokens)
            decision = ctl.submit(ticket)
            assert decision is None or isinstance(decision, Grant), decision
            if decision is None:
                queued.append((ticket, seq))
            else:
                start(seq, decision)
        for ticket, seq in list(queued):
            if ticket.future is not None and ticket.future.done():
                queued.remove((ticket, seq))
                start(seq, Grant(ticket, 0.0))
        plan = scheduler.schedule()  # raises KVExhausted on OOM
        for seq in Scheduler.complete(plan):
            if seq.is_done:
                scheduler.finish(seq)
                grant = grants.pop(seq.request_id, None)
                if grant is not None:
                    ctl.release(grant)
    # Everything admitted ran to the end and gave its tokens back.
    assert not busy()
    assert ctl.inflight_tokens == 0 and allocator.num_free_blocks == BLOCKS


@settings(max_examples=60, deadline=None)
@given(arrivals)
# Seven 65-token requests fit a 512-token budget counted per token, but need
# 7 x 5 = 35 blocks of 16 when they finish: only whole-block costs catch that.
@example([[(1, 64)] * 7])
async def test_admitted_work_never_exhausts_the_kv_cache(
    steps: list[list[tuple[int, int]]],
) -> None:
    run(steps, admission=True)


async def test_the_same_arrivals_without_admission_do_oom() -> None:
    burst = [[(300, 100)] * 4]
    try:
        run(burst, admission=False)
    except KVExhausted:
        pass
    else:
        raise AssertionError("expected an OOM without admission")
    run(burst, admission=True)
