"""BlockPool: allocation, ref counts, chained-hash prefix reuse, LRU eviction of cached free blocks."""

from __future__ import annotations

import pytest
import torch

from backend.engine.block_pool import BlockPool, chain_hash


def make_pool(num_blocks: int = 4, block_size: int = 4) -> BlockPool:
    return BlockPool(
        num_blocks, block_size, num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu"
    )


def test_kv_is_preallocated_per_layer_in_the_shared_layout() -> None:
    pool = make_pool(num_blocks=5, block_size=16)
    assert len(pool.k_caches) == len(pool.v_caches) == 2
    assert all(t.shape == (5, 16, 2, 8) for t in pool.k_caches + pool.v_caches)


def test_allocate_release_and_ref_counts() -> None:
    pool = make_pool()
    a, b = pool.allocate(), pool.allocate()
    assert a != b and pool.num_free_blocks == 2
    pool.acquire(a)
    assert pool.ref_count(a) == 2
    pool.release(a)
    assert pool.ref_count(a) == 1 and not pool.is_free(a)
    pool.release(a)
    pool.release(b)
    assert pool.num_free_blocks == 4
    with pytest.raises(AssertionError):
        pool.release(b)


def test_exhausted_pool_refuses_to_allocate() -> None:
    pool = make_pool(num_blocks=2)
    pool.allocate(), pool.allocate()
    with pytest.raises(RuntimeError):
        pool.allocate()


def test_chained_hash_depends_on_the_whole_prefix() -> None:
    first = chain_hash(None, [1, 2, 3, 4])
    assert chain_hash(first, [5, 6, 7, 8]) == chain_hash(chain_hash(None, [1, 2, 3, 4]), [5, 6, 7, 8])
    assert chain_hash(first, [5, 6, 7, 8]) != chain_hash(chain_hash(None, [9, 2, 3, 4]), [5, 6, 7, 8])


def test_registered_block_is_found_and_revived_after_free() -> None:
    pool = make_pool()
    block = pool.allocate()
    h = chain_hash(None, [1, 2, 3, 4])
    pool.register(block, h, [1, 2, 3, 4], None)
    pool.release(block)
    assert pool.is_free(block) and pool.num_cached_blocks == 1
    assert pool.lookup(h, [1, 2, 3, 4]) == block
    assert pool.lookup(h, [1, 2, 3, 5]) is None  # same hash, other tokens: never a false hit
    pool.acquire(block)
    assert pool.ref_count(block) == 1 and pool.num_free_blocks == 3


def test_empty_blocks_go_first_then_cached_ones_least_recently_freed_first() -> None:
    pool = make_pool(num_blocks=3)
    blocks = [pool.allocate() for _ in range(3)]
    hashes = [chain_hash(None, [i] * 4) for i in range(3)]
    for block, h, i in zip(blocks, hashes, range(3), strict=True):
        pool.register(block, h, [i] * 4, None)
    for block in (blocks[1], blocks[0], blocks[2]):  # free order: 1, 0, 2
        pool.release(block)
    assert pool.allocate() == blocks[1]  # the oldest cached block is evicted first
    assert pool.lookup(hashes[1], [1] * 4) is None
    assert pool.lookup(hashes[0], [0] * 4) == blocks[0]
    assert pool.allocate() == blocks[0]
    assert pool.lookup(hashes[2], [2] * 4) == blocks[2]


def test_no_leak_after_mixed_use() -> None:
    pool = make_pool(num_blocks=8)
    held = [pool.allocate() for _ in range(8)]
    for i, block in enumerate(held[:4]):
        pool.register(block, chain_hash(None, [i] * 4), [i] * 4, None)
    for block in held[:2]:
        pool.acquire(block)
    for block in held + held[:2]:
        pool.release(block)
    assert pool.num_free_blocks == 8
    assert all(pool.ref_count(b) == 0 for b in range(8))
