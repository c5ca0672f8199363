"""A deliberately naive paged attention, kept as the oracle for the real backends (tests, harness/gpu/check.py).

One sequence at a time: read the sequence's tokens slot by slot, repeat KV heads for GQA, softmax in fp32
with the causal mask aligned to the end. Reads the caches only: the caller writes the new K/V first.
"""

from __future__ import annotations

import torch

from backend.attention.context import AttentionContext


def reference_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttentionContext
) -> torch.Tensor:
    """q: [T, H, D]; caches: [num_blocks, block_size, KH, D] -> [T, H, D] in q's dtype."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[2]
    bs = ctx.block_size
    starts = ctx.query_start_host
    tables = ctx.block_tables.tolist()
    out = torch.empty_like(q)
    for i, (n, length) in enumerate(zip(ctx.query_lens, ctx.context_lens_host, strict=True)):
        slots = torch.tensor([tables[i][p // bs] * bs + p % bs for p in range(length)], device=q.device)
        keys = k_cache.flatten(0, 1)[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        values = v_cache.flatten(0, 1)[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        queries = q[starts[i] : starts[i] + n].float()  # [n, H, D]
        scores = torch.einsum("nhd,lhd->hnl", queries, keys) / head_dim**0.5  # [H, n, L]
        query_pos = torch.arange(length - n, length, device=q.device)[:, None]  # [n, 1]
        visible = torch.arange(length, device=q.device)[None, :] <= query_pos  # [n, L]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[starts[i] : starts[i] + n] = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values).to(q.dtype)
    return out
