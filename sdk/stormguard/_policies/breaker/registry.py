"""One circuit breaker per (endpoint, model), made on first use, bounded in number."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ..._core.clock import Clock
from ..._core.fork import fork_safe_lock
from .circuit import CircuitBreaker
from .config import BreakerConfig
from .states import BreakerListener, BreakerSnapshot

__all__ = ["BreakerRegistry"]


class BreakerRegistry:
    """One breaker per (endpoint, model), made on first use from one config.

    Bounded: past ``max_breakers`` keys the least recently used breaker is
    forgotten, so a client that calls many models cannot grow without end (a
    forgotten breaker starts closed when its key comes back); the breakers of an
    endpoint that leaves the client's set go with it (``forget``).

    >>> registry = BreakerRegistry()
    >>> registry.get("http://gpu-1/v1", "llama") is registry.get("http://gpu-1/v1", "llama")
    True
    """

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        max_breakers: int = 1024,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        listeners: Sequence[BreakerListener] = (),
    ) -> None:
        if max_breakers < 1:
            raise ValueError("max_breakers must be at least 1")
        self.config = config if config is not None else BreakerConfig()
        self.max_breakers = max_breakers
        self._clock = clock or Clock()
        self._rng = rng or random.Random()
        self._listeners = tuple(listeners)
        self._breakers: OrderedDict[tuple[str, str | None], CircuitBreaker] = OrderedDict()
        self._lock = fork_safe_lock()

    @staticmethod
    def breaker_name(endpoint: str, model: str | None) -> str:
        """``model@endpoint``, or the endpoint alone for calls without a model."""
        return endpoint if model is None else f"{model}@{endpoint}"

    def get(self, endpoint: str, model: str | None = None) -> CircuitBreaker:
        """The breaker of ``(endpoint, model)``, created closed if new."""
        key = (endpoint, model)
        with self._lock:
            breaker = self._breakers.get(key)
            if breaker is not None:
                self._breakers.move_to_end(key)
                return breaker
            breaker = CircuitBreaker(
                self.breaker_name(endpoint, model),
                self.config,
                clock=self._clock,
                rng=self._rng,
                listeners=self._listeners,
            )
            self._breakers[key] = breaker
            if len(self._breakers) > self.max_breakers:
                self._breakers.popitem(last=False)
            return breaker

    def forget(self, endpoints: Iterable[str]) -> None:
        """These endpoints left the client's set (DNS discovery): their breakers go,
        every model's. A permit still held settles on its own breaker, which nothing
        reads any more; an address that comes back starts closed."""
        gone = set(endpoints)
        with self._lock:
            for key in [key for key in self._breakers if key[0] in gone]:
                del self._breakers[key]

    def snapshot(self) -> dict[tuple[str, str | None], BreakerSnapshot]:
        """Every breaker's state, keyed by (endpoint, model)."""
        with self._lock:
            items = list(self._breakers.items())
        return {key: breaker.snapshot() for key, breaker in items}

    def __len__(self) -> int:
        with self._lock:
            return len(self._breakers)
