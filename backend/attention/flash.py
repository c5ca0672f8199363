"""Paged attention with the flash-attn package (CUDA, fp16/bf16, block size a multiple of 256).

Decode-only steps use `flash_attn_with_kvcache` (one query per sequence, paged through `block_table`);
any step with a prefill chunk uses `flash_attn_varlen_func` with `block_table`, whose causal mask is
aligned to the end, so chunked prefill over a cached prefix needs no mask. flash_attn is imported lazily:
this module imports on CPU-only machines; constructing the backend is what needs the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backend.attention.backend import write_kv
from backend.attention.context import AttentionContext

FLASH_BLOCK_MULTIPLE = 256


def flash_attn_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class FlashPlan:
    ctx: AttentionContext
    block_table: torch.Tensor  # [B, max_blocks] int32
    cache_seqlens: torch.Tensor  # [B] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    cu_seqlens_k: torch.Tensor  # [B + 1] int32
    max_seqlen_q: int
    max_seqlen_k: int


class FlashBackend:
    name = "flash"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
        if block_size % FLASH_BLOCK_MULTIPLE != 0:
            raise ValueError(f"flash-attn paged KV needs a block size multiple of 256, got {block_size}")
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen: Any = flash_attn_varlen_func
        self._with_kvcache: Any = flash_attn_with_kvcache
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size

    def plan(self, ctx: AttentionContext) -> FlashPlan:
        assert ctx.block_size == self.block_size
        seqlens_k = ctx.context_lens.to(torch.int32)
        cu_seqlens_k = torch.zeros(ctx.num_seqs + 1, dtype=torch.int32, device=seqlens_k.device)
        cu_seqlens_k[1:] = torch.cumsum(seqlens_k, dim=0)
        return FlashPlan(
            ctx=ctx,
            block_table=ctx.block_tables.to(torch.int32).contiguous(),
            cache_seqlens=seqlens_k,
            cu_seqlens_q=ctx.query_start_loc.to(torch.int32),
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=ctx.max_query_len,
            max_seqlen_k=ctx.max_context_len,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: object,
    ) -> torch.Tensor:
        assert isinstance(plan, FlashPlan)
        assert q.dtype in (torch.float16, torch.bfloat16), "flash-attn needs fp16/bf16"
        # q: [T, H, D]; k, v: [T, KH, D]; caches: [num_blocks, block_size, KH, D]
        write_kv(k, v, k_cache, v_cache, plan.ctx.slot_mapping)
        if plan.ctx.is_decode_only:
            num = plan.ctx.num_seqs
            out = self._with_kvcache(
                q.view(num, 1, self.num_heads, self.head_dim),  # [B, 1, H, D]
                k_cache,
                v_cache,
                cache_seqlens=plan.cache_seqlens,
                block_table=plan.block_table,
                causal=True,
            )  # [B, 1, H, D]
            return out.view(num, self.num_heads, self.head_dim)
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=plan.cu_seqlens_q,
            cu_seqlens_k=plan.cu_seqlens_k,
            max_seqlen_q=plan.max_seqlen_q,
            max_seqlen_k=plan.max_seqlen_k,
            causal=True,
            block_table=plan.block_table,
        )  # [T, H, D]
