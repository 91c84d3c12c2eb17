"""Paged KV-cache block allocator with automatic prefix caching: it only says
whether slots fit.

Modelled on vLLM's ``KVCacheManager.allocate_slots`` and ``BlockPool``: a request
owns whole blocks of ``block_size`` token slots; asking for slots that do not fit
returns ``None`` and changes nothing. What to do then (wait, preempt, crash) is the
scheduler's decision, never the allocator's.

Prefix caching: a full block whose KV has been computed may be named by its chained
hash (``prefix_cache.block_hashes``, ``cache_blocks``); a later request whose prompt
starts with the same blocks takes them (``find_cached``, then ``allocate`` with
them) and shares them, reference-counted. A block nobody uses goes back to the free
queue but keeps its hash, so it can still be hit until it is reused: blocks without
a hash are reused first, then hashed ones least recently freed first (vLLM's
eviction order; a request's blocks are freed last block first, so a prompt's head,
the part most often shared, outlives its tail). A block in use is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class BlockAllocator:
    """Fixed pool of KV blocks shared by all sequences."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Blocks nobody uses, in the order they are reused (front first).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._owned: dict[Hashable, list[int]] = {}
        self._slots: dict[Hashable, int] = {}
        self._hashed: dict[Hashable, int] = {}  # leading owned blocks already offered a hash

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (cached ones among them: they can be evicted)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a hash, in use or not."""
        return len(self._cached)

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

    def find_cached(self, block_hashes: Sequence[int], max_tokens: int) -> list[int]:
        """The cached blocks of the longest run of ``block_hashes`` from the first, at
        most ``max_tokens`` worth of them (whole blocks). Changes nothing."""
        found: list[int] = []
        for block_hash in block_hashes[: max(0, max_tokens) // self.block_size]:
            block = self._cached.get(block_hash)
            if block is None:
                break  # chained hashes: nothing after a miss can hit
            found.append(block)
        return found

    def can_allocate(
        self, owner: Hashable, num_new_tokens: int, cached: Sequence[int] = ()
    ) -> bool:
        """Whether ``num_new_tokens`` more slots for ``owner``, after the ``cached``
        blocks (``find_cached``), would fit now."""
        return self._free_blocks_needed(owner, num_new_tokens, cached) <= len(self._free)

    def allocate(
        self, owner: Hashable, num_new_tokens: int, cached: Sequence[int] = ()
    ) -> list[int] | None:
        """Reserve the ``cached`` blocks (shared, their tokens already computed), then
        ``num_new_tokens`` more slots for ``owner``.

        Returns the newly taken block ids (possibly empty when the last block
        still had room), or ``None`` when they do not fit; nothing changes then.
        """
        if self._free_blocks_needed(owner, num_new_tokens, cached) > len(self._free):
            return None
        owned = self._owned.setdefault(owner, [])
        for block in cached:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        owned.extend(cached)
        self._slots[owner] = self._slots.get(owner, 0) + len(cached) * self.block_size
        taken = [self._take_free() for _ in range(self._blocks_missing(owner, num_new_tokens))]
        owned.extend(taken)
        self._slots[owner] += num_new_tokens
        return taken

    def cache_blocks(self, owner: Hashable, block_hashes: Sequence[int], num_blocks: int) -> None:
        """Name ``owner``'s first ``num_blocks`` blocks (full, computed or being
        computed) by their ``block_hashes``. A hash another block already holds stays
        with that one."""
        owned = self._owned.get(owner, ())
        start = self._hashed.get(owner, 0)
        end = min(num_blocks, len(block_hashes), len(owned))
        for index in range(start, end):
            block, block_hash = owned[index], block_hashes[index]
            if block not in self._hash_of and block_hash not in self._cached:
                self._hash_of[block] = block_hash
                self._cached[block_hash] = block
        if end > start:
            self._hashed[owner] = end

    def free(self, owner: Hashable) -> int:
        """Release every block of ``owner``; returns how many were freed. Those nobody
        else uses go back to the free queue, keeping their hash."""
        blocks = self._owned.pop(owner, [])
        self._slots.pop(owner, None)
        self._hashed.pop(owner, None)
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if block not in self._hash_of:
                    self._free.move_to_end(block, last=False)
        return len(blocks)

    def reset_prefix_cache(self) -> None:
        """Forget every hash (the engine restarted: its KV memory is gone)."""
        self._hash_of.clear()
        self._cached.clear()
        self._hashed.clear()

    def _take_free(self) -> int:
        """The next free block for new slots, evicting its hash if it had one."""
        block, _ = self._free.popitem(last=False)
        block_hash = self._hash_of.pop(block, None)
        if block_hash is not None:
            del self._cached[block_hash]
        self._refs[block] = 1
        return block

    def _free_blocks_needed(
        self, owner: Hashable, num_new_tokens: int, cached: Sequence[int]
    ) -> int:
        cached_tokens = len(cached) * self.block_size
        new = self._blocks_missing(owner, cached_tokens + num_new_tokens) - len(cached)
        revived = sum(1 for block in cached if self._refs[block] == 0)
        return max(0, new) + revived

    def _blocks_missing(self, owner: Hashable, num_new_tokens: int) -> int:
        held = len(self._owned.get(owner, ()))
        needed = self.blocks_for(self._slots.get(owner, 0) + num_new_tokens)
        return max(0, needed - held)
