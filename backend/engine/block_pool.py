"""The KV block pool: K and V preallocated once per layer, plus the bookkeeping of who uses which block.

Layout per layer: [num_blocks, block_size, kv_heads, head_dim], shared by every attention backend.
A block is in use (ref count > 0), free and empty, or free but still cached: it carries the chained hash
of a full block of tokens and can be revived by a later request with the same prefix. Allocation takes
empty blocks first and then evicts cached free blocks least recently freed first (LRU).
"""

from __future__ import annotations

import math
import mmap
from collections import OrderedDict, deque
from collections.abc import Sequence as Seq

import torch


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.zeros, but on the CPU as an anonymous memory map, whose pages the OS hands out zeroed on first touch,
    so a pool of hundreds of MB costs nothing at start (torch.zeros writes every page: 0.15-4 s for SmolLM2's
    default 755 MB on the shared 2-core machine). Not numpy's calloc: numpy asks for huge pages on large blocks,
    and the kernel's compaction for them made a step's first touch of 60 caches take 1.1 s here; 4 KB pages take
    under 1 ms. Page-aligned."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return (
        torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)
    )  # the tensor keeps the map alive


def salt_root(salt: str) -> int | None:
    """The "previous hash" of a sequence's first block: its request's `cache_salt` (vLLM's), so blocks are shared
    only between requests with the same salt (a tenant's prompts never warm another tenant's); None unsalted."""
    return hash(("cache_salt", salt)) if salt else None


def chain_hash(prev_hash: int | None, token_ids: Seq[int]) -> int:
    """Hash of a full block given the previous block's hash: equal hashes mean equal whole prefixes."""
    return hash((prev_hash, tuple(token_ids)))


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # k_caches[i], v_caches[i]: [num_blocks, block_size, KH, D], views of one zeroed allocation
        caches = zeroed((2, num_layers, *shape), dtype, device)
        self.k_caches = list(caches[0].unbind(0))
        self.v_caches = list(caches[1].unbind(0))
        self._ref_counts = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free_empty: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # oldest first

    # ---- counts ----------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now: empty ones plus cached ones that may be evicted."""
        return len(self._free_empty) + len(self._free_cached)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks carrying a prefix hash, in use or free."""
        return len(self._hash_to_block)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def is_free(self, block: int) -> bool:
        return self._ref_counts[block] == 0

    # ---- allocation --------------------------------------------------------------------------------------

    def allocate(self) -> int:
        """A fresh block with ref count 1; evicts the least recently freed cached block if none is empty."""
        if self._free_empty:
            block = self._free_empty.popleft()
        elif self._free_cached:
            block, _ = self._free_cached.popitem(last=False)
            self._forget(block)
        else:
            raise RuntimeError("block pool exhausted; callers must check num_free_blocks first")
        assert self._ref_counts[block] == 0
        self._ref_counts[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """Take another reference to a block (a prefix hit); revives it if it was free and cached."""
        if self._ref_counts[block] == 0:
            assert block in self._free_cached, f"block {block} is free but not cached"
            del self._free_cached[block]
        self._ref_counts[block] += 1

    def release(self, block: int) -> None:
        assert self._ref_counts[block] > 0, f"double free of block {block}"
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            if self._hash[block] is not None:
                self._free_cached[block] = None  # most recently freed: evicted last
            else:
                self._free_empty.append(block)

    # ---- prefix cache ------------------------------------------------------------------------------------

    def lookup(self, block_hash: int, token_ids: Seq[int]) -> int | None:
        """The cached block holding exactly these tokens after the hashed prefix, if any."""
        block = self._hash_to_block.get(block_hash)
        if block is None or self._tokens[block] != tuple(token_ids):
            return None
        return block

    def register(self, block: int, block_hash: int, token_ids: Seq[int]) -> None:
        """Mark a full, computed, in-use block as reusable. A hash already cached elsewhere is kept."""
        assert self._ref_counts[block] > 0 and len(token_ids) == self.block_size
        if self._hash[block] is not None or block_hash in self._hash_to_block:
            return
        self._hash[block] = block_hash
        self._tokens[block] = tuple(token_ids)
        self._hash_to_block[block_hash] = block

    def _forget(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is not None and self._hash_to_block.get(block_hash) == block:
            del self._hash_to_block[block_hash]
        self._hash[block] = None
        self._tokens[block] = None
