"""Sequence-level KV bookkeeping over the BlockPool: prefix matching, growing block tables, freeing.

Prefix reuse: the leading full blocks of a sequence are identified by chained hashes; at admission the
longest run of cached blocks is shared (ref count + 1) instead of recomputed. At least one token is always
left to compute, because the step that computes it produces the logits for the next token. Once a block is
full and its KV is written, it is registered so later requests (or this one after a preemption) can reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from backend.engine.block_pool import BlockPool, chain_hash, salt_root
from backend.engine.sequence import Sequence


class KVCacheManager:
    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_prefix_caching = enable_prefix_caching

    def _block_hash(self, seq: Sequence, index: int) -> int:
        """Chained hash of full block `index` of the sequence, memoised on the sequence."""
        bs = self.block_size
        assert (index + 1) * bs <= seq.num_tokens
        while len(seq.block_hashes) <= index:
            i = len(seq.block_hashes)
            prev = seq.block_hashes[i - 1] if i > 0 else salt_root(seq.params.cache_salt)
            seq.block_hashes.append(chain_hash(prev, seq.token_ids[i * bs : (i + 1) * bs]))
        return seq.block_hashes[index]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the sequence's leading full blocks (not yet acquired)."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs  # leave at least one token to compute
        blocks: list[int] = []
        for i in range(max_blocks):
            block = self.pool.lookup(self._block_hash(seq, i), seq.token_ids[i * bs : (i + 1) * bs])
            if block is None:
                break
            blocks.append(block)
        return blocks

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: Seq[int] = ()) -> bool:
        """Give the sequence blocks for `num_new_tokens` more tokens; False (and no change) if the pool is short.

        `cached_blocks` (from match_prefix, only for a sequence holding no blocks) become its leading blocks.
        """
        assert num_new_tokens > 0
        assert not cached_blocks or not seq.block_table
        num_computed = len(cached_blocks) * self.block_size if cached_blocks else seq.num_computed_tokens
        needed = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = needed - len(seq.block_table) - len(cached_blocks)
        revived = sum(1 for b in cached_blocks if self.pool.is_free(b))
        if max(num_new_blocks, 0) + revived > self.pool.num_free_blocks:
            return False
        if cached_blocks:
            for block in cached_blocks:  # acquire first so the allocations below cannot evict them
                self.pool.acquire(block)
            seq.block_table.extend(cached_blocks)
            seq.num_computed_tokens = num_computed
        for _ in range(num_new_blocks):
            seq.block_table.append(self.pool.allocate())
        return True

    def cache_full_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """Register the blocks this step filled: all their tokens are computed (their KV is in the pool)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(num_computed_before // bs, seq.num_computed_tokens // bs):
            self.pool.register(
                seq.block_table[i], self._block_hash(seq, i), seq.token_ids[i * bs : (i + 1) * bs]
            )

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first, so the LRU evicts a prefix's tail before its head."""
        for block in reversed(seq.block_table):
            self.pool.release(block)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
