"""The engine seam: what the HTTP layer and the admission layer need from an engine.

The embedded simulator (``sim_engine.SimEngine``) sits behind it, and
everything above (routes, admission, headers, metrics) only sees these types.
Admission reads nothing but ``EngineLoad``, which real vLLM's gauges fill too
(``vllm/engine_load.py``), so the same admission layer fronts either one. An
engine streams ``TokenDelta`` for a ``GenerationRequest``, aborts on request or
when the request's deadline passes (within one step), and reports its live load
and lifetime counters (``EngineLoad``, ``EngineStats``) for headers, budget and
metrics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

# Where an engine is in its lifecycle (``EngineLoad.state``, /ready's "state").
EnginePhase = Literal["starting", "ready", "restarting", "warming", "stopped"]
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One sequence to generate (n=1): sizes are in the engine's tokens."""

    request_id: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Seconds the caller still waits, from when ``generate`` is called (its
    # x-request-deadline-ms less the time spent before); None: no deadline.
    timeout_s: float | None = None
    # The output's tokens, when the answer is decided before generation (a JSON
    # document, tool-call arguments: structured.py): the engine emits them in order
    # instead of its own words and stops after the last (EOS), or at max_tokens.
    script: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New output since the previous delta; the last one carries ``finish_reason``."""

    text: str
    output_tokens: int
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """The engine's live state, read on every response for the load headers."""

    state: EnginePhase
    kv_cache_usage: float
    kv_capacity_tokens: int
    running: int
    waiting: int
    # 0..1 while the engine ramps up after a restart (slow start); 1 otherwise.
    capacity_factor: float = 1.0
    # When not ready: best guess of seconds until it is (None = unknown).
    ready_in_s: float | None = None
    # KV slots are allocated in blocks of this many tokens (1 = per token).
    kv_block_size: int = 1

    @property
    def ready(self) -> bool:
        """True when the engine accepts work."""
        return self.state == "ready"


@dataclass(slots=True)
class EngineStats:
    """Lifetime counters of an engine, exported as Prometheus counters."""

    requests_started: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_deadline_exceeded: int = 0
    requests_failed: int = 0
    prompt_tokens_computed: int = 0
    # Prefix cache, in tokens as vLLM counts them: prompt tokens looked up when a
    # request entered the batch, and those found cached (not computed).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    output_tokens: int = 0
    steps: int = 0
    preemptions: int = 0
    ooms: int = 0
    crashes: int = 0
    restarts: int = 0
    oom_restart_loops: int = 0
    injected_errors: int = 0


class EngineError(Exception):
    """An engine could not serve a request; the HTTP layer answers 5xx."""


class EngineUnavailable(EngineError):
    """The engine is not ready (cold restart or warm-up); ``ready_in_s`` is a guess."""

    def __init__(self, message: str, *, ready_in_s: float | None = None) -> None:
        super().__init__(message)
        self.ready_in_s = ready_in_s


class EngineCrashed(EngineError):
    """The engine died (out of KV memory or a crash fault) while the request was in it."""


class InjectedError(EngineError):
    """The random-error fault fired for this request."""


class DeadlineExceeded(EngineError):
    """The caller's deadline passed while the request was in the engine, which aborted
    it at its next step (its KV blocks freed); ``output_tokens`` were generated."""

    def __init__(self, output_tokens: int) -> None:
        super().__init__(
            f"the request's deadline passed after {output_tokens} output tokens: "
            "the engine aborted it"
        )
        self.output_tokens = output_tokens


class Engine(Protocol):
    """What any engine behind the admission layer provides."""

    @property
    def model(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def stats(self) -> EngineStats: ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (for prompt counts and /tokenize)."""
        ...

    def chat_prompt(
        self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool
    ) -> str:
        """The prompt text of chat messages given as (role, content), per the model's template."""
        ...

    def load(self) -> EngineLoad:
        """Live load; cheap, called on every response."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        """Stream the output; raises ``EngineError`` (``DeadlineExceeded`` once
        ``request.timeout_s`` has passed). Closing the iterator aborts."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request at the next step boundary (no-op when unknown)."""
        ...
