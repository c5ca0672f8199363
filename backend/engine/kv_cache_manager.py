"""Sequence-level KV bookkeeping over the BlockPool: prefix matching, growing block tables, freeing.

Prefix reuse: the leading full blocks of a sequence are identified by chained hashes; at admission the
longest run of cached blocks is shared (ref count + 1) instead of recomputed. Where the next full block misses,
reuse goes on token by token: the cached block that followed the same chain (same parent hash, so the same salt
and preceding blocks) and shares the longest run of leading tokens with the prompt lends the KV rows of those
tokens, copied into the sequence's own fresh block (a block that will be written is never shared). At least one
token is always left to compute, because the step that computes it produces the logits for the next token.
Once a block is full and its KV is written, it is registered so later requests (or this one after a preemption)
can reuse it; the block a sequence leaves partly computed when it is freed is kept for partial matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.engine.block_pool import BlockPool, chain_hash, salt_root
from backend.engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """What admission reuses: cached full blocks to share, then the first `partial_tokens` rows of block
    `partial` to copy into the sequence's next block. `num_tokens` is the whole cached count."""

    blocks: tuple[int, ...] = ()
    partial: int | None = None
    partial_tokens: int = 0
    num_tokens: int = 0


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
            seq.block_hashes.append(
                chain_hash(self._parent_hash(seq, i), seq.token_ids[i * bs : (i + 1) * bs])
            )
        return seq.block_hashes[index]

    def _parent_hash(self, seq: Sequence, index: int) -> int | None:
        """The chain hash before block `index`: the previous block's, or the salt root for the first."""
        return self._block_hash(seq, index - 1) if index > 0 else salt_root(seq.params.cache_salt)

    def match_prefix(self, seq: Sequence) -> PrefixHit:
        """The cached prefix of the sequence (nothing acquired yet): leading full blocks, then a partial block."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return PrefixHit()
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs  # leave at least one token to compute
        blocks: list[int] = []
        for i in range(max_blocks):
            block = self.pool.lookup(self._block_hash(seq, i), seq.token_ids[i * bs : (i + 1) * bs])
            if block is None:
                break
            blocks.append(block)
        start = len(blocks) * bs
        wanted = seq.token_ids[start : min(start + bs, seq.num_tokens - 1)]  # the last token stays computed
        found = self.pool.partial_match(self._parent_hash(seq, len(blocks)), wanted) if wanted else None
        partial, t = found if found is not None else (None, 0)
        return PrefixHit(tuple(blocks), partial, t, start + t)

    def allocate(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit | None = None) -> bool:
        """Give the sequence blocks for `num_new_tokens` more tokens; False (and no change) if the pool is short.

        `hit` (from match_prefix, only for a sequence holding no blocks): its full blocks become the sequence's
        leading blocks and its partial rows are copied into the next one; `seq.num_computed_tokens` then says
        how many tokens were reused.
        """
        assert num_new_tokens > 0
        assert hit is None or not seq.block_table
        hit = hit or PrefixHit(num_tokens=seq.num_computed_tokens)
        if hit.partial is not None and not self._fits(seq, num_new_tokens, hit):
            # too tight to hold the copy's source while the new blocks are allocated: compute those rows
            hit = PrefixHit(hit.blocks, num_tokens=len(hit.blocks) * self.block_size)
        if not self._fits(seq, num_new_tokens, hit):
            return False
        for block in self._held(hit):  # acquire first so the allocations below cannot evict them
            self.pool.acquire(block)
        seq.block_table.extend(hit.blocks)
        seq.num_computed_tokens = hit.num_tokens
        while len(seq.block_table) * self.block_size < hit.num_tokens + num_new_tokens:
            seq.block_table.append(self.pool.allocate())
        if hit.partial is not None:
            self.pool.copy_rows(hit.partial, seq.block_table[len(hit.blocks)], hit.partial_tokens)
            self.pool.release(hit.partial)
        return True

    @staticmethod
    def _held(hit: PrefixHit) -> list[int]:
        """The cached blocks an admission holds: the shared ones, and the partial source while it is copied."""
        return [*hit.blocks, *([] if hit.partial is None else [hit.partial])]

    def _fits(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit) -> bool:
        needed = -(-(hit.num_tokens + num_new_tokens) // self.block_size)
        num_new_blocks = needed - len(seq.block_table) - len(hit.blocks)
        revived = sum(1 for b in self._held(hit) if self.pool.is_free(b))
        return max(num_new_blocks, 0) + revived <= self.pool.num_free_blocks

    def cache_full_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """Register the blocks this step filled: all their tokens are computed (their KV is in the pool)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(num_computed_before // bs, seq.num_computed_tokens // bs):
            self.pool.register(
                seq.block_table[i],
                self._block_hash(seq, i),
                seq.token_ids[i * bs : (i + 1) * bs],
                self._parent_hash(seq, i),
            )

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first, so the LRU evicts a prefix's tail before its head. The
        block holding its last computed tokens, when partly filled, stays cached for partial matches."""
        bs, computed = self.block_size, seq.num_computed_tokens
        index = computed // bs
        if self.enable_prefix_caching and computed % bs and index < len(seq.block_table):
            tokens = seq.token_ids[index * bs : computed]
            self.pool.register_partial(seq.block_table[index], tokens, self._parent_hash(seq, index))
        for block in reversed(seq.block_table):
            self.pool.release(block)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
