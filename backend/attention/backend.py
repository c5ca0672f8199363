"""The attention backend interface: plan once per step, then run once per layer.

`plan` turns the AttentionContext into whatever the backend's kernels need (masks, int32 tables) so the
per-layer `forward` does no host work. `forward` first writes the step's new K/V into the pool slots and
then attends over each sequence's cached blocks.
"""

from __future__ import annotations

from typing import Protocol

import torch

from backend.attention.context import AttentionContext


class AttentionBackend(Protocol):
    name: str

    def plan(self, ctx: AttentionContext) -> object: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: object,
    ) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KH, D], caches: [num_blocks, block_size, KH, D] -> [T, H, D]."""
        ...


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter the new tokens' K/V into their pool slots."""
    # k, v: [T, KH, D]; k_cache, v_cache: [num_blocks, block_size, KH, D]; slot_mapping: [T] int64
    assert k.shape == v.shape and k.shape[1:] == k_cache.shape[2:], (k.shape, k_cache.shape)
    assert k.dtype == k_cache.dtype, f"K dtype {k.dtype} != cache dtype {k_cache.dtype}"
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)
