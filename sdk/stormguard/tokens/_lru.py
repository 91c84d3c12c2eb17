"""A small thread-safe LRU map."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from .._core.fork import fork_safe_lock

__all__ = ["LRUCache"]

K = TypeVar("K")
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """Bounded map that evicts the least recently used entry.

    Hand-written (twenty lines) because ``functools.lru_cache`` memoizes a function's
    own return value, while here values arrive later, from a response sent into a
    flow; a dependency such as cachetools is not worth it for this.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = fork_safe_lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
