"""Per-model configuration keyed by exact model names or glob patterns."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

__all__ = ["ModelMap"]

V = TypeVar("V")

_GLOB_CHARS = frozenset("*?[")


class ModelMap(Generic[V], Mapping[str, V]):
    """A read-only mapping from model patterns to values, looked up by model name.

    Keys are exact model names (``"gpt-4o"``) or ``fnmatch`` globs (``"gpt-4o*"``,
    ``"meta-llama/*"``; a prefix is written ``"prefix*"``). An exact key wins; among
    globs the longest pattern wins (the most specific), ties by insertion order::

        windows = ModelMap({"gpt-4o*": 128_000, "gpt-4o-mini": 64_000})
        windows.lookup("gpt-4o-mini")   # 64000 (exact)
        windows.lookup("gpt-4o-2024")   # 128000 (glob)
        windows.lookup("llama")         # None
    """

    def __init__(self, entries: Mapping[str, V] | None = None) -> None:
        self._entries: dict[str, V] = dict(entries or {})
        globs = [key for key in self._entries if _GLOB_CHARS & set(key)]
        self._globs = sorted(globs, key=len, reverse=True)  # sort is stable: ties keep order

    def lookup(self, model: str) -> V | None:
        """The value for ``model``, or None when no key matches."""
        if model in self._entries:
            return self._entries[model]
        for pattern in self._globs:
            if fnmatch.fnmatchcase(model, pattern):
                return self._entries[pattern]
        return None

    def __getitem__(self, key: str) -> V:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ModelMap({self._entries!r})"
