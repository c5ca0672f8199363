"""Paged attention with torch `scaled_dot_product_attention`: the CPU path, and a fallback on any GPU.

Each step: write new K/V into the pool, gather each sequence's blocks, attend with an explicit causal mask
aligned to the end (query i of a sequence with n new tokens and L cached ones sees keys j <= L - n + i).
Decodes (one query each) run as one batched call with a padding mask; prefill chunks run one call per
sequence. GQA never copies K/V: the G query heads that share a KV head are folded into the query-length
axis (q: [KH, G * n, D] against k: [KH, L, D]).
With `cuda_flash_prefill`, prefill chunks use torch's own flash kernel (is_causal when nothing is cached,
a lower-right causal bias otherwise), for CUDA machines without the flash-attn package.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from backend.attention.backend import write_kv
from backend.attention.context import AttentionContext


@dataclass(frozen=True, slots=True)
class _DecodeGroup:
    token_index: torch.Tensor  # [Bd] int64, rows of q that are single-token decodes
    block_tables: torch.Tensor  # [Bd, nb] int64
    mask: torch.Tensor  # [Bd, 1, 1, nb * block_size] bool, True where the key is in the sequence


@dataclass(frozen=True, slots=True)
class _PrefillSeq:
    q_start: int
    q_end: int
    block_ids: torch.Tensor  # [nb] int64
    context_len: int
    mask: torch.Tensor | None  # [G * n, L] bool; None on the torch-flash path


@dataclass(frozen=True, slots=True)
class SdpaPlan:
    ctx: AttentionContext
    decode: _DecodeGroup | None
    prefills: tuple[_PrefillSeq, ...]


class SdpaBackend:
    name = "sdpa"

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, cuda_flash_prefill: bool = False
    ) -> None:
        assert num_heads % num_kv_heads == 0
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.cuda_flash_prefill = cuda_flash_prefill

    def plan(self, ctx: AttentionContext) -> SdpaPlan:
        device = ctx.block_tables.device
        bs = ctx.block_size
        starts = ctx.query_start_host
        decode_rows = [i for i, n in enumerate(ctx.query_lens) if n == 1]
        decode = None
        if decode_rows:
            lens = [ctx.context_lens_host[i] for i in decode_rows]
            num_blocks = -(-max(lens) // bs)
            rows = torch.tensor(decode_rows, device=device)
            block_tables = ctx.block_tables[rows, :num_blocks].long()  # [Bd, nb]
            lens_t = torch.tensor(lens, device=device)
            visible = torch.arange(num_blocks * bs, device=device)[None, :] < lens_t[:, None]  # [Bd, L]
            token_index = torch.tensor([starts[i] for i in decode_rows], device=device)
            decode = _DecodeGroup(token_index, block_tables, visible[:, None, None, :])
        prefills = []
        for i, n in enumerate(ctx.query_lens):
            if n == 1:
                continue
            length = ctx.context_lens_host[i]
            block_ids = ctx.block_tables[i, : -(-length // bs)].long()  # [nb]
            mask: torch.Tensor | None = None
            if not self.cuda_flash_prefill:
                # causal, aligned to the end: query i sees keys j <= (L - n) + i
                causal = torch.ones(n, length, dtype=torch.bool, device=device).tril(diagonal=length - n)
                mask = causal.repeat(self.group, 1)  # [G * n, L], rows ordered (g, i)
            prefills.append(_PrefillSeq(starts[i], starts[i] + n, block_ids, length, mask))
        return SdpaPlan(ctx, decode, tuple(prefills))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: object,
    ) -> torch.Tensor:
        assert isinstance(plan, SdpaPlan)
        # q: [T, H, D]; k, v: [T, KH, D]; caches: [num_blocks, block_size, KH, D]
        write_kv(k, v, k_cache, v_cache, plan.ctx.slot_mapping)
        if plan.decode is not None and not plan.prefills:
            return self._decode(q, k_cache, v_cache, plan.decode)
        out = torch.empty_like(q)  # [T, H, D]
        if plan.decode is not None:
            out[plan.decode.token_index] = self._decode(q, k_cache, v_cache, plan.decode)
        for seq in plan.prefills:
            out[seq.q_start : seq.q_end] = self._prefill(q[seq.q_start : seq.q_end], k_cache, v_cache, seq)
        return out

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: _DecodeGroup
    ) -> torch.Tensor:
        kv_heads, head_dim = self.num_kv_heads, self.head_dim
        num = group.block_tables.shape[0]
        qd = q.index_select(0, group.token_index) if q.shape[0] != num else q
        qd = qd.view(num, kv_heads, self.group, head_dim)  # [Bd, KH, G, D]
        keys = k_cache[group.block_tables].view(num, -1, kv_heads, head_dim).transpose(1, 2)  # [Bd, KH, L, D]
        values = (
            v_cache[group.block_tables].view(num, -1, kv_heads, head_dim).transpose(1, 2)
        )  # [Bd, KH, L, D]
        out = F.scaled_dot_product_attention(qd, keys, values, attn_mask=group.mask)  # [Bd, KH, G, D]
        return out.reshape(num, self.num_heads, head_dim)  # [Bd, H, D]

    def _prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: _PrefillSeq
    ) -> torch.Tensor:
        # q: [n, H, D]
        n, length, kv_heads, head_dim = q.shape[0], seq.context_len, self.num_kv_heads, self.head_dim
        keys = k_cache[seq.block_ids].view(-1, kv_heads, head_dim)[:length]  # [L, KH, D]
        values = v_cache[seq.block_ids].view(-1, kv_heads, head_dim)[:length]  # [L, KH, D]
        if seq.mask is None:
            return _torch_flash_prefill(q, keys, values)
        qg = (
            q.view(n, kv_heads, self.group, head_dim)
            .permute(1, 2, 0, 3)
            .reshape(kv_heads, self.group * n, head_dim)
        )
        out = F.scaled_dot_product_attention(
            qg, keys.transpose(0, 1), values.transpose(0, 1), attn_mask=seq.mask
        )  # [KH, G * n, D]
        return (
            out.view(kv_heads, self.group, n, head_dim)
            .permute(2, 0, 1, 3)
            .reshape(n, self.num_heads, head_dim)
        )


def _torch_flash_prefill(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Prefill through torch SDPA's fused kernels (CUDA, fp16/bf16); lower-right causal when L > n."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    # q: [n, H, D]; keys, values: [L, KH, D]
    n, length, group = q.shape[0], keys.shape[0], q.shape[1] // keys.shape[1]
    qh = q.transpose(0, 1)[None]  # [1, H, n, D]
    kh = keys.repeat_interleave(group, dim=1).transpose(0, 1)[None]  # [1, H, L, D]
    vh = values.repeat_interleave(group, dim=1).transpose(0, 1)[None]  # [1, H, L, D]
    if n == length:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)  # [1, H, n, D]
    else:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(n, length))
    return out[0].transpose(0, 1)  # [n, H, D]
