"""Real vLLM's live load, in the ``EngineLoad`` shape the admission layer reads.

The KV capacity is the engine's own: ``cache_config.num_gpu_blocks`` (set in
the API process once the engine core has profiled its memory) times the block
size. The live figures are vLLM's gauges, read in-process with
``vllm.v1.metrics.reader.get_metrics_snapshot()``: KV-cache usage, running and
waiting requests. Reading the registry costs a few hundred microseconds, and
the load headers want it on every response, so a reading is reused for
``max_age`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.engine.base import EngineLoad

__all__ = ["VllmLoadReader"]

_GAUGES = {
    "vllm:kv_cache_usage_perc": "kv",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


class VllmLoadReader:
    """``reader()`` -> the current ``EngineLoad`` of the AsyncLLM ``engine_client``."""

    def __init__(
        self,
        engine_client: Any,
        *,
        max_age: float = 0.05,
        clock: ClockLike | None = None,
        snapshot: Callable[[], list[Any]] | None = None,
    ) -> None:
        self._engine = engine_client
        self._max_age = max_age
        self._clock = as_clock(clock)
        if snapshot is None:
            from vllm.v1.metrics.reader import get_metrics_snapshot

            snapshot = get_metrics_snapshot
        self._snapshot = snapshot
        self._cached: EngineLoad | None = None
        self._at = float("-inf")

    def capacity_tokens(self) -> tuple[int, int]:
        """(KV capacity in tokens, block size) as the engine configured them."""
        cache = self._engine.vllm_config.cache_config
        block_size = int(getattr(cache, "block_size", None) or 16)
        blocks = int(getattr(cache, "num_gpu_blocks", None) or 0)
        return blocks * block_size, block_size

    def max_model_len(self) -> int:
        return int(self._engine.model_config.max_model_len)

    def tokenizer(self) -> Any:
        """vLLM's own tokenizer (with the model's chat template)."""
        return self._engine.get_tokenizer()

    def __call__(self) -> EngineLoad:
        now = self._clock.now()
        if self._cached is not None and now - self._at < self._max_age:
            return self._cached
        values = {"kv": 0.0, "running": 0.0, "waiting": 0.0}
        for metric in self._snapshot():
            key = _GAUGES.get(getattr(metric, "name", ""))
            if key is not None:
                values[key] += float(getattr(metric, "value", 0.0) or 0.0)
        capacity, block_size = self.capacity_tokens()
        errored = bool(getattr(self._engine, "errored", False))
        self._cached = EngineLoad(
            state="stopped" if errored else "ready",
            kv_cache_usage=min(max(values["kv"], 0.0), 1.0),
            kv_capacity_tokens=capacity,
            running=int(values["running"]),
            waiting=int(values["waiting"]),
            kv_block_size=block_size,
        )
        self._at = now
        return self._cached
