"""Block hashes of automatic prefix caching, as vLLM's ``hash_block_tokens``.

A prompt's token ids are cut into full blocks of ``block_size`` (a partial last
block is never cached); each block is named by a hash of its parent block's hash
and its own token ids, so a hash stands for the whole prefix up to the end of its
block: the same block after a different prefix has another hash. Python's ``hash``
of a tuple of ints does not depend on ``PYTHONHASHSEED``, so hashes are stable
across processes; a 64-bit collision in a simulation is not worth guarding against.
"""

from __future__ import annotations

from collections.abc import Sequence

# The parent of a prompt's first block (vLLM's NONE_HASH).
ROOT_HASH = 0


def hash_block_tokens(parent_hash: int, block_token_ids: Sequence[int]) -> int:
    """The hash of one full block after the block hashed ``parent_hash``."""
    return hash((parent_hash, tuple(block_token_ids)))


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The chained hashes of every full block of ``token_ids``."""
    hashes: list[int] = []
    parent = ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return tuple(hashes)
