"""The KV block pool: K and V preallocated once per layer, plus the bookkeeping of who uses which block.

Layout per layer: [num_blocks, block_size, kv_heads, head_dim], shared by every attention backend.
A block is in use (ref count > 0), free and empty, or free but still cached: it carries the chained hash
of a full block of tokens and can be revived by a later request with the same prefix, or it holds the leading
computed tokens of a block a sequence left partly filled (no hash: never revived, only copied from). Allocation
takes empty blocks first and then evicts cached free blocks least recently freed first (LRU).

Token-granular reuse: every cached block is also indexed under its parent's chain hash (the hash of the full
blocks before it, salted), the most recent few per parent, so a prompt whose next full block misses can copy the
KV rows of the longest run of leading tokens it shares with a block that followed the same prefix.
"""

from __future__ import annotations

import math
import mmap
from collections import OrderedDict, deque
from collections.abc import Sequence as Seq

import torch

PARTIAL_CANDIDATES = 8  # cached blocks kept per parent for partial matches: a miss scans at most these


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
        # [2, layers, num_blocks, block_size, KH, D]: one copy moves a block's rows in every layer
        self._caches = caches
        self.k_caches = list(caches[0].unbind(0))
        self.v_caches = list(caches[1].unbind(0))
        self._ref_counts = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._parent: list[int | None] = [None] * num_blocks  # the chain hash before a cached block
        self._hash_to_block: dict[int, int] = {}
        # parent chain hash -> the cached blocks that followed it, oldest first (at most PARTIAL_CANDIDATES)
        self._children: dict[int | None, OrderedDict[int, None]] = {}
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
            if self._tokens[block] is not None:
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

    def register(self, block: int, block_hash: int, token_ids: Seq[int], parent: int | None) -> None:
        """Mark a full, computed, in-use block as reusable; `parent`: the chain hash before it (the salt root
        for a first block). A hash already cached elsewhere is kept."""
        assert self._ref_counts[block] > 0 and len(token_ids) == self.block_size
        if self._hash[block] is not None or block_hash in self._hash_to_block:
            return
        self._hash[block] = block_hash
        self._hash_to_block[block_hash] = block
        self._index(block, parent, token_ids)

    def register_partial(self, block: int, token_ids: Seq[int], parent: int | None) -> None:
        """Keep the computed leading `token_ids` of a block its only user is about to release, as a source of
        partial matches after `parent`; the block is then cached free (LRU) like a full one."""
        assert self._ref_counts[block] == 1 and 0 < len(token_ids) < self.block_size
        if self._tokens[block] is None:
            self._index(block, parent, token_ids)

    def partial_match(self, parent: int | None, token_ids: Seq[int]) -> tuple[int, int] | None:
        """(block, t) for the cached block after `parent` whose first t tokens equal the first t of `token_ids`,
        t >= 1 as large as any candidate's (the most recent on a tie); None when no candidate shares a token."""
        best: tuple[int, int] | None = None
        for block in reversed(self._children.get(parent, ())):
            cached = self._tokens[block]
            assert cached is not None
            t = 0
            for a, b in zip(cached, token_ids, strict=False):  # a partial block is shorter
                if a != b:
                    break
                t += 1
            if t > 0 and (best is None or t > best[1]):
                best = (block, t)
        return best

    def copy_rows(self, src: int, dst: int, num_rows: int) -> None:
        """Copy the K and V of the first `num_rows` slots of block `src` into block `dst`, every layer."""
        self._caches[:, :, dst, :num_rows].copy_(self._caches[:, :, src, :num_rows])

    def _index(self, block: int, parent: int | None, token_ids: Seq[int]) -> None:
        self._tokens[block] = tuple(token_ids)
        self._parent[block] = parent
        children = self._children.setdefault(parent, OrderedDict())
        children[block] = None
        if len(children) > PARTIAL_CANDIDATES:
            oldest, _ = children.popitem(last=False)
            if self._hash[oldest] is None and self._ref_counts[oldest] == 0:
                # a partly filled block serves only as a candidate: out of the index, it is empty again
                del self._free_cached[oldest]
                self._forget(oldest)
                self._free_empty.append(oldest)

    def _forget(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is not None and self._hash_to_block.get(block_hash) == block:
            del self._hash_to_block[block_hash]
        parent = self._parent[block]
        children = self._children.get(parent)
        if children is not None and block in children:
            del children[block]
            if not children:
                del self._children[parent]
        self._hash[block] = None
        self._tokens[block] = None
        self._parent[block] = None
