"""The embedded simulated engine: an asyncio busy loop around the scheduler.

Like vLLM's engine core, one loop owns all state: it applies aborts (the
callers' and those of requests whose deadline has passed), plans a step with
the scheduler, "computes" it by sleeping for the cost model's step time, then
hands each sampled token to its request's stream. Sleeping costs no CPU, so
thousands of simulated requests run on a laptop.

Lifecycle: ``starting`` (warm-up probe) -> ``ready``; an OOM or a crash fault
fails every running and waiting request, then ``restarting`` (cold for
``restart_s``) -> ``warming`` (probe) -> ``ready`` with a slow-start ramp.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import math
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import SimEngineConfig
from stormguard_server.engine import tokenizer
from stormguard_server.engine.base import (
    DeadlineExceeded,
    EngineCrashed,
    EngineLoad,
    EnginePhase,
    EngineStats,
    EngineUnavailable,
    FinishReason,
    GenerationRequest,
    InjectedError,
    TokenDelta,
)
from stormguard_server.engine.faults import FaultState
from stormguard_server.engine.kv_cache import BlockAllocator
from stormguard_server.engine.prefix_cache import block_hashes
from stormguard_server.engine.scheduler import (
    KVExhausted,
    Scheduler,
    SequenceState,
    StepPlan,
    natural_output_tokens,
)

logger = logging.getLogger("stormguard_server.engine")

_PROBE_ID = "__warmup_probe__"
_IDLE_POLL_S = 0.05
#: The longest a request held by the hang fault waits without a deadline of its own.
HANG_LIMIT_S = 600.0


@functools.lru_cache(maxsize=32)
def _encoded(text: str) -> tuple[int, ...]:
    """``text``'s token ids, kept for the last few prompts: the API counts a prompt's
    tokens (``encode``) just before the engine hashes its blocks for the prefix cache,
    and a 4,000-token prompt takes ~5 ms to tokenize. A few, as a prompt's ids take
    ~36 bytes a token; a prompt queued past them is tokenized again."""
    return tuple(tokenizer.encode(text))


@dataclass(eq=False)
class _Stream:
    """Per-request output channel between the loop and ``generate``."""

    queue: asyncio.Queue[TokenDelta | Exception] = field(default_factory=asyncio.Queue)
    text: str = ""
    emitted_chars: int = 0


class SimEngine:
    """Simulated continuous-batching engine; see the module docstring."""

    def __init__(
        self,
        config: SimEngineConfig,
        faults: FaultState | None = None,
        *,
        clock: ClockLike | None = None,
    ) -> None:
        self.config = config
        self._clock = as_clock(clock)
        self.faults = faults or FaultState(oom_crash=config.oom_crash, clock=self._clock)
        self._stats = EngineStats()
        self.allocator = BlockAllocator(config.num_kv_blocks, config.block_size)
        self.scheduler = Scheduler(
            self.allocator,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            oom_crash=self.faults.oom_crash,
            prefix_caching=config.prefix_caching,
        )
        self._streams: dict[str, _Stream] = {}
        self._pending_aborts: set[str] = set()
        # (deadline on self._clock, request id); entries of finished requests stay
        # until they surface or the heap is compacted (``_track_deadline``).
        self._deadlines: list[tuple[float, str]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._state: EnginePhase = "stopped"
        self._ready_at: float | None = None
        self._ready_since = -math.inf
        self._ramping = False
        self._probe_done: asyncio.Event = asyncio.Event()

    # -- the seam ---------------------------------------------------------

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def stats(self) -> EngineStats:
        return self._stats

    @property
    def state(self) -> EnginePhase:
        return self._state

    def encode(self, text: str) -> list[int]:
        return list(_encoded(text))

    def chat_prompt(
        self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def load(self) -> EngineLoad:
        ready_in: float | None = None
        if self._state != "ready" and self._ready_at is not None:
            ready_in = max(0.0, self._ready_at - self._clock.now())
        return EngineLoad(
            state=self._state,
            kv_cache_usage=self.allocator.usage,
            kv_capacity_tokens=self.config.kv_capacity_tokens,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            capacity_factor=self._capacity_factor(),
            ready_in_s=ready_in,
            kv_block_size=self.config.block_size,
        )

    async def start(self) -> None:
        if self._task is not None:
            return
        self._state = "starting"
        self._ready_at = self._clock.now() + self._probe_time()
        self._task = asyncio.create_task(self._run(), name="sim-engine-loop")
        await self._probe_done.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_everything(EngineUnavailable("engine stopped"))
        self._state = "stopped"

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        deadline = None if request.timeout_s is None else self._clock.now() + request.timeout_s
        if self._state != "ready":
            raise EngineUnavailable(f"engine is {self._state}", ready_in_s=self.load().ready_in_s)
        if self.faults.should_inject_error():
            self._stats.injected_errors += 1
            raise InjectedError("injected engine error")
        if self.faults.should_hang():
            await self._hang(deadline)
        if self.faults.added_latency_s > 0:
            await self._clock.sleep(self.faults.added_latency_s)
        stream = self._enqueue(request, deadline)
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request.request_id)

    async def _hang(self, deadline: float | None) -> None:
        """The hang fault: no answer, holding no KV block, until the request's deadline
        (then ``DeadlineExceeded``, as a request aborted in the engine) or
        ``HANG_LIMIT_S`` (then an injected error). A client that leaves first cancels it
        (``disconnect.py``), as a timed-out client does at a hung provider."""
        now = self._clock.now()
        wait = HANG_LIMIT_S if deadline is None else min(HANG_LIMIT_S, max(0.0, deadline - now))
        await self._clock.sleep(wait)
        if deadline is not None and self._clock.now() >= deadline:
            raise DeadlineExceeded(0)
        raise InjectedError("injected hang ended without an answer")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's ``reset_prefix_cache``: only when no
        request is in the engine (False, and nothing changes, otherwise)."""
        if self.scheduler.running or self.scheduler.waiting:
            return False
        self.allocator.reset_prefix_cache()
        return True

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self._pending_aborts.add(request_id)
            self._wake.set()

    # -- the loop ---------------------------------------------------------

    def _enqueue(self, request: GenerationRequest, deadline: float | None) -> _Stream:
        target = natural_output_tokens(request, self.config.natural_output_tokens)
        seed = zlib.crc32(request.prompt.encode("utf-8", "surrogatepass")) ^ self.config.seed
        seq = SequenceState(
            request=request,
            target_output_tokens=target,
            text_seed=seed,
            block_hashes=self._block_hashes(request),
        )
        stream = _Stream()
        self._streams[request.request_id] = stream
        self.scheduler.add(seq)
        self._stats.requests_started += 1
        if deadline is not None:
            self._track_deadline(deadline, request.request_id)
        self._wake.set()
        return stream

    def _block_hashes(self, request: GenerationRequest) -> tuple[int, ...] | None:
        """The prompt's block hashes for the prefix cache; None when caching is off or
        the prompt's text is not what its token count was taken from (then the prompt
        is neither looked up nor cached)."""
        if not self.config.prefix_caching:
            return None
        token_ids = _encoded(request.prompt)
        if len(token_ids) != request.prompt_tokens:
            return None
        return block_hashes(token_ids, self.config.block_size)

    def _track_deadline(self, deadline: float, request_id: str) -> None:
        heapq.heappush(self._deadlines, (deadline, request_id))
        if len(self._deadlines) > 2 * len(self._streams) + 64:  # drop the finished ones
            self._deadlines = [d for d in self._deadlines if d[1] in self._streams]
            heapq.heapify(self._deadlines)

    async def _run(self) -> None:
        self._start_probe()
        while True:
            self._apply_aborts()
            stalled = self.faults.stall_remaining()
            if stalled > 0:
                await self._clock.sleep(min(stalled, 0.05))
                continue
            if self.faults.take_crash_request():
                await self._crash("crash fault")
                continue
            self.scheduler.oom_crash = self.faults.oom_crash
            try:
                plan = self.scheduler.schedule(self._seq_limit())
            except KVExhausted as exc:
                self._stats.ooms += 1
                await self._crash(f"out of KV cache: {exc}")
                continue
            self._stats.preemptions += len(plan.preempted)
            self._stats.prefix_cache_queries += plan.cache_queries
            self._stats.prefix_cache_hits += plan.cache_hits
            if plan.is_empty:
                # Idle: sleep until work arrives, polling now and then for faults
                # switched on from the admin endpoint (crash now, stall), and waking
                # for the next deadline of a request waiting for KV blocks.
                self._wake.clear()
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await self._clock.wait(woken, self._idle_wait())
                finally:
                    woken.cancel()
                continue
            await self._clock.sleep(self._step_time(plan))
            self._stats.steps += 1
            self._stats.prompt_tokens_computed += plan.prefill_tokens
            self._emit(Scheduler.complete(plan))

    def _step_time(self, plan: StepPlan) -> float:
        """The cost model: a fixed launch cost, per prefill token, per decoding sequence."""
        cfg = self.config
        return (
            cfg.step_base_s
            + cfg.prefill_token_s * plan.prefill_tokens
            + cfg.decode_seq_s * plan.num_decode
        )

    def _probe_time(self) -> float:
        cfg = self.config
        return cfg.step_base_s * (cfg.warmup_probe_tokens + 1) + cfg.prefill_token_s * 16

    def _emit(self, sampled: list[SequenceState]) -> None:
        for seq in sampled:
            stream = self._streams.get(seq.request_id)
            if stream is None:
                self.scheduler.finish(seq)
                continue
            self._stats.output_tokens += 1
            script = seq.request.script
            if script is not None:
                stream.text += script[seq.output_tokens - 1]
            else:
                stream.text += tokenizer.output_piece(seq.text_seed, seq.output_tokens)
            finish = self._finish_reason(seq, stream)
            delta = TokenDelta(
                text=stream.text[stream.emitted_chars :],
                output_tokens=seq.output_tokens,
                finish_reason=finish,
            )
            stream.emitted_chars = len(stream.text)
            if finish is not None:
                self.scheduler.finish(seq)
                del self._streams[seq.request_id]
                self._stats.requests_finished += 1
                if seq.request_id == _PROBE_ID:
                    self._on_probe_done()
                    continue
            stream.queue.put_nowait(delta)

    @staticmethod
    def _finish_reason(seq: SequenceState, stream: _Stream) -> FinishReason | None:
        for stop in seq.request.stop:
            at = stream.text.find(stop, max(0, stream.emitted_chars - len(stop) + 1))
            if stop and at >= 0:
                stream.text = stream.text[:at]
                return "stop"
        if seq.is_done:
            script = seq.request.script
            if script is not None and seq.output_tokens >= len(script):
                return "stop"  # a script's last token is its EOS, even at max_tokens
            return "length" if seq.output_tokens >= seq.request.max_tokens else "stop"
        return None

    def _apply_aborts(self) -> None:
        """Finish, between two steps, the requests their callers aborted and those
        whose deadline has passed: their blocks are freed before the next step is
        planned. A request past its deadline ends with ``DeadlineExceeded``; one
        whose caller left is only dropped (nobody reads its stream)."""
        expired = self._pop_expired() - self._pending_aborts
        finishing = self._pending_aborts | expired
        if not finishing:
            return
        self._pending_aborts = set()
        found = {seq.request_id: seq for seq in self.scheduler.finish_requests(finishing)}
        for request_id in finishing:
            stream = self._streams.pop(request_id, None)
            if stream is None:
                continue
            if request_id in expired:
                self._stats.requests_deadline_exceeded += 1
                seq = found.get(request_id)
                stream.queue.put_nowait(DeadlineExceeded(seq.output_tokens if seq else 0))
            else:
                self._stats.requests_aborted += 1

    def _pop_expired(self) -> set[str]:
        """Requests still in the engine whose deadline has passed."""
        now, expired = self._clock.now(), set()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, request_id = heapq.heappop(self._deadlines)
            if request_id in self._streams:
                expired.add(request_id)
        return expired

    def _idle_wait(self) -> float:
        if not self._deadlines:
            return _IDLE_POLL_S
        return min(_IDLE_POLL_S, max(0.0, self._deadlines[0][0] - self._clock.now()))

    # -- crash, restart, warm-up ------------------------------------------

    async def _crash(self, why: str) -> None:
        now = self._clock.now()
        self._stats.crashes += 1
        loop = now - self._ready_since <= self.config.restart_loop_period_s
        if loop:
            self._stats.oom_restart_loops += 1
        self._fail_everything(EngineCrashed(f"engine crashed: {why}"))
        self.allocator.reset_prefix_cache()
        self._state = "restarting"
        self._ready_at = now + self.config.restart_s + self._probe_time()
        logger.warning(
            "engine crashed",
            extra={
                "event": "engine_crash",
                "reason": why,
                "restart_loop": loop,
                "restart_s": self.config.restart_s,
            },
        )
        await self._clock.sleep(self.config.restart_s)
        self._stats.restarts += 1
        self._state = "warming"
        self._ramping = True
        self._start_probe()

    def _start_probe(self) -> None:
        probe = GenerationRequest(
            request_id=_PROBE_ID,
            prompt="warm-up probe",
            prompt_tokens=16,
            max_tokens=self.config.warmup_probe_tokens,
            ignore_eos=True,
        )
        seq = SequenceState(request=probe, target_output_tokens=probe.max_tokens)
        self._streams[_PROBE_ID] = _Stream()
        self.scheduler.add(seq)

    def _on_probe_done(self) -> None:
        self._state = "ready"
        self._ready_at = None
        if self._ramping:
            self._ready_since = self._clock.now()
        self._probe_done.set()
        logger.info("engine ready", extra={"event": "engine_ready", "ramp": self._ramping})

    def _fail_everything(self, error: Exception) -> None:
        for seq in self.scheduler.drain_all():
            stream = self._streams.pop(seq.request_id, None)
            if stream is not None and seq.request_id != _PROBE_ID:
                self._stats.requests_failed += 1
                stream.queue.put_nowait(error)
        for stream in self._streams.values():
            stream.queue.put_nowait(error)
        self._streams.clear()
        self._pending_aborts.clear()
        self._deadlines.clear()

    def _capacity_factor(self) -> float:
        """Slow start: after a restart, capacity grows linearly from the floor to 1."""
        if self._state != "ready" or self.config.slow_start_s <= 0:
            return 1.0 if self._state == "ready" else 0.0
        elapsed = self._clock.now() - self._ready_since
        if elapsed >= self.config.slow_start_s:
            return 1.0
        floor = self.config.slow_start_floor
        return floor + (1.0 - floor) * max(0.0, elapsed) / self.config.slow_start_s

    def _seq_limit(self) -> int:
        return max(1, math.floor(self.config.max_num_seqs * self._capacity_factor()))
