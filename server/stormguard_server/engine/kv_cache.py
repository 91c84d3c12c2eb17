"""Paged KV-cache block allocator: it only says whether slots fit.

Modelled on vLLM's ``KVCacheManager.allocate_slots``: a request owns whole
blocks of ``block_size`` token slots; asking for slots that do not fit returns
``None`` and changes nothing. What to do then (wait, preempt, crash) is the
scheduler's decision, never the allocator's.
"""

from __future__ import annotations

from collections.abc import Hashable


class BlockAllocator:
    """Fixed pool of KV blocks shared by all sequences."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))
        self._owned: dict[Hashable, list[int]] = {}
        self._slots: dict[Hashable, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence owns."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` slots."""
        return -(-num_tokens // self.block_size)

    def slots_of(self, owner: Hashable) -> int:
        """Token slots currently reserved by ``owner``."""
        return self._slots.get(owner, 0)

    def can_allocate(self, owner: Hashable, num_new_tokens: int) -> bool:
        """Whether ``num_new_tokens`` more slots for ``owner`` would fit now."""
        return self._blocks_missing(owner, num_new_tokens) <= len(self._free)

    def allocate(self, owner: Hashable, num_new_tokens: int) -> list[int] | None:
        """Reserve ``num_new_tokens`` more slots for ``owner``.

        Returns the newly taken block ids (possibly empty when the last block
        still had room), or ``None`` when they do not fit; nothing changes then.
        """
        missing = self._blocks_missing(owner, num_new_tokens)
        if missing > len(self._free):
            return None
        taken = [self._free.pop() for _ in range(missing)]
        self._owned.setdefault(owner, []).extend(taken)
        self._slots[owner] = self._slots.get(owner, 0) + num_new_tokens
        return taken

    def free(self, owner: Hashable) -> int:
        """Release every block of ``owner``; returns how many were freed."""
        blocks = self._owned.pop(owner, [])
        self._slots.pop(owner, None)
        self._free.extend(reversed(blocks))
        return len(blocks)

    def _blocks_missing(self, owner: Hashable, num_new_tokens: int) -> int:
        held = len(self._owned.get(owner, ()))
        needed = self.blocks_for(self._slots.get(owner, 0) + num_new_tokens)
        return max(0, needed - held)
