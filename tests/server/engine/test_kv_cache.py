"""The allocator only answers fits / does not fit, and never changes state on a miss."""

from __future__ import annotations

import pytest

from stormguard_server.engine.kv_cache import BlockAllocator


def test_allocation_rounds_up_to_blocks_and_reuses_the_last_one() -> None:
    kv = BlockAllocator(num_blocks=4, block_size=16)
    assert kv.allocate("a", 17) is not None
    assert kv.num_free_blocks == 2
    assert kv.allocate("a", 15) == []  # the second block still had 15 free slots
    assert kv.slots_of("a") == 32
    assert len(kv.allocate("a", 1) or []) == 1
    assert kv.usage == 0.75


def test_a_miss_returns_none_and_changes_nothing() -> None:
    kv = BlockAllocator(num_blocks=2, block_size=16)
    assert kv.allocate("a", 20) is not None
    assert kv.allocate("b", 17) is None
    assert kv.num_free_blocks == 0
    assert kv.slots_of("b") == 0
    assert not kv.can_allocate("b", 1)
    assert kv.can_allocate("a", 12)


def test_free_returns_blocks() -> None:
    kv = BlockAllocator(num_blocks=3, block_size=4)
    kv.allocate("a", 8)
    kv.allocate("b", 4)
    assert kv.free("a") == 2
    assert kv.free("a") == 0
    assert kv.num_free_blocks == 2
    assert kv.allocate("c", 8) is not None
    assert kv.usage == 1.0


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BlockAllocator(num_blocks=0, block_size=16)
