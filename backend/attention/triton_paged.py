"""Paged attention through the Triton kernel of triton_kernel.py: the CUDA backend, flash-attn or not.

One launch per layer covers the whole step (decodes, fresh prefills, chunks over a cached prefix), reading the
pool in place through the block tables: no gather, no mask tensor, any block size, GQA without copying K/V. The
tile shapes are fixed per model (`BLOCK_M` rows, `BLOCK_N` keys), never chosen from the batch, which is what makes
the kernel batch-invariant by construction (see triton_kernel.py); the selector makes it the CUDA default in
batch-invariant mode. triton is imported on construction, so this module imports where triton is absent; on a
CPU it runs only under Triton's interpreter (`TRITON_INTERPRET=1`, set before triton is first imported).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from backend.attention.backend import write_kv
from backend.attention.context import AttentionContext

BLOCK_M = 16  # query rows per program, (token, head) pairs: tl.dot's minimum, so a decode wastes the least
BLOCK_N = 64  # keys per tile
# Added to the causal bound (a key is visible at position <= the query's + MASK_SHIFT). Always 0: the kernel tests
# plant 1 and -1 here to show the comparison with the reference catches an off-by-one in the mask.
MASK_SHIFT = 0


def interpreting() -> bool:
    """Whether triton runs its CPU interpreter (read by triton when it is first imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True, slots=True)
class TritonPlan:
    ctx: AttentionContext
    block_tables: torch.Tensor  # [B, max_blocks] int32, contiguous
    context_lens: torch.Tensor  # [B] int32
    query_start: torch.Tensor  # [B + 1] int32
    grid: tuple[int, int, int]  # (B, KH, tiles of new tokens in the longest chunk)


class TritonPagedBackend:
    name = "triton"

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, block_n: int = BLOCK_N
    ) -> None:
        assert num_heads % num_kv_heads == 0
        assert block_n >= 16 and block_n & (block_n - 1) == 0, "BLOCK_N: a power of two, at least 16"
        from backend.attention.triton_kernel import paged_attention_kernel

        self._kernel: Any = paged_attention_kernel
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.block_size = block_size
        self.block_n = block_n
        self.group_pad = 1 << (self.group - 1).bit_length()  # next power of two
        self.block_m = max(BLOCK_M, self.group_pad)
        self.block_d = max(16, 1 << (head_dim - 1).bit_length())
        self.tokens_per_program = self.block_m // self.group_pad

    def plan(self, ctx: AttentionContext) -> TritonPlan:
        assert ctx.block_size == self.block_size
        tiles = -(-ctx.max_query_len // self.tokens_per_program)
        return TritonPlan(
            ctx=ctx,
            block_tables=ctx.block_tables.to(torch.int32).contiguous(),
            context_lens=ctx.context_lens.to(torch.int32),
            query_start=ctx.query_start_loc.to(torch.int32),
            grid=(ctx.num_seqs, self.num_kv_heads, tiles),
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
        assert isinstance(plan, TritonPlan)
        # q: [T, H, D] (any strides); k, v: [T, KH, D]; caches: [num_blocks, block_size, KH, D]
        assert q.shape[1:] == (self.num_heads, self.head_dim), q.shape
        assert k_cache.shape[1:] == (self.block_size, self.num_kv_heads, self.head_dim), k_cache.shape
        write_kv(k, v, k_cache, v_cache, plan.ctx.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, H, D] contiguous
        self._kernel[plan.grid](
            q, k_cache, v_cache, out,
            plan.block_tables, plan.context_lens, plan.query_start,
            self.head_dim**-0.5 * math.log2(math.e),
            *q.stride(), *k_cache.stride(), *v_cache.stride(), out.stride(0), out.stride(1),
            plan.block_tables.stride(0),
            BLOCK_SIZE=self.block_size,
            GROUP=self.group,
            GROUP_PAD=self.group_pad,
            HEAD_DIM=self.head_dim,
            BLOCK_D=self.block_d,
            BLOCK_M=self.block_m,
            BLOCK_N=self.block_n,
            MASK_SHIFT=MASK_SHIFT,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            UPCAST=q.dtype == torch.bfloat16 and interpreting(),
        )  # fmt: skip
        return out
