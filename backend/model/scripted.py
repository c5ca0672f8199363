"""The decoder stack as one TorchScript call: the eager layers' very aten ops, minus the Python between them.

A batch-1 decode step is op-bound on CPU: about 35 small ops a layer, and each pays Python interpretation and
argument parsing on top of the dispatcher (py-spy, SmolLM2 at batch 1: ~30% of a step). TorchScript runs the
same graph from C++. The ops, their order, arguments, shapes and dtypes are exactly those of
`layers.LlamaDecoderLayer.forward`, `tiling.tiled_rows` and `InvariantSdpaBackend.forward`, and the graph runs
under `optimized_execution(False)` (no fusion, no decomposition, no peephole rewrites), so every output bit is
the eager path's: tests compare the two bitwise, and the fp32 goldens pin them. Not inductor: its generated
kernels reduce (RMSNorm's mean) and exponentiate (SiLU) in their own order and approximations, so its bits
differ from the aten kernels the batch-invariance contract was measured on.
Used on CPU when the attention is the batch-invariant SDPA backend (`StepAttention`); anything else is eager.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import List  # noqa: UP035 (TorchScript reads List)

import torch
from torch import Tensor
from torch.nn import functional as F

from backend.attention.invariant import StepAttention, aligned_heads
from backend.kernels.load import declare_op
from backend.model.config import LlamaConfig
from backend.model.layers import MATMUL_DENSE, LlamaDecoderLayer

_LOG = logging.getLogger(__name__)


def _matmul(kind: int, a: Tensor, b: Tensor, rows: Tensor) -> Tensor:
    # rows: [M, in] -> [M, out]: Int4Linear / Int8Linear / TiledLinear `matmul` (kinds: layers.MATMUL_*)
    if kind == 0:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), a, 32, b)
    if kind == 1:
        return torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), a, b)
    if kind == 3:
        return torch.ops.tokenedge.int4_mm(rows.to(torch.bfloat16), a, b)
    return F.linear(rows, a)


def _aligned(rows: Tensor) -> Tensor:
    # `tiling.aligned`: rows on a 64-byte boundary of their storage (tiling.ALIGN_BYTES), else a copy
    if rows.is_contiguous() and (rows.storage_offset() * rows.element_size()) % 64 == 0:
        return rows
    return rows.clone(memory_format=torch.contiguous_format)


def _linear(kind: int, a: Tensor, b: Tensor, x: Tensor, tile: int, min_rows: int) -> Tensor:
    # `tiling.tiled_rows` over `_matmul`; tile 0: one call (the non-invariant forward)
    num_rows = x.size(0)
    if tile == 0:
        return _matmul(kind, a, b, x)
    if num_rows == 0 or (min_rows <= num_rows and num_rows <= tile):
        return _matmul(kind, a, b, _aligned(x))
    outs: List[Tensor] = []  # noqa: UP006
    for start in range(0, num_rows, tile):
        part = x[start : start + tile]  # [m, in]
        rows = part.size(0)
        if rows < min_rows:
            pad = part.new_zeros([min_rows - rows, part.size(1)])
            part = torch.cat((part, pad))  # [min_rows, in]
        outs.append(_matmul(kind, a, b, _aligned(part))[:rows])
    if len(outs) == 1:
        return outs[0]
    return torch.cat(outs)


def _rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    # `rope.apply_rope`: x [T, heads, D] rotated in fp32, returned in x's dtype
    xf = x.float()
    if interleaved:
        x1 = xf[:, :, 0::2]
        x2 = xf[:, :, 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        half = xf.size(-1) // 2
        swapped = torch.cat((xf[:, :, half:], xf[:, :, :half]), dim=-1)
        out = xf * cos + swapped * sin
    return out.to(x.dtype)


def _attend(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    blocks: Tensor,
    seqs: int,
    mask: Tensor,
    dims: List[int],  # noqa: UP006
) -> Tensor:
    # `InvariantSdpaBackend._attend`: q [R, H, D] -> [R, H, D]
    num_heads, kv_heads, head_dim = dims[0], dims[1], dims[2]
    rows = q.size(0)
    qr = aligned_heads(q.reshape(rows, kv_heads, num_heads // kv_heads, head_dim))  # [R, KH, G, D]
    keys = k_cache.index_select(0, blocks).view(seqs, -1, kv_heads, head_dim).transpose(1, 2)
    values = v_cache.index_select(0, blocks).view(seqs, -1, kv_heads, head_dim).transpose(1, 2)
    if seqs != rows:
        keys = keys.expand(rows, -1, -1, -1)  # [R, KH, L, D]
        values = values.expand(rows, -1, -1, -1)
    out = F.scaled_dot_product_attention(qr, keys, values, attn_mask=mask)  # [R, KH, G, D]
    return out.reshape(rows, num_heads, head_dim)


def _attention(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    token_index: List[Tensor],  # noqa: UP006
    block_ids: List[Tensor],  # noqa: UP006
    num_seqs: List[int],  # noqa: UP006
    masks: List[Tensor],  # noqa: UP006
    in_order: bool,
    dims: List[int],  # noqa: UP006
    interleaved: bool,
) -> Tensor:
    # `LlamaAttention.forward` between the projections, and `InvariantSdpaBackend.forward`: qkv [T, ...] -> [T, H*D]
    num_heads, kv_heads, head_dim = dims[0], dims[1], dims[2]
    num_tokens = qkv.size(0)
    qk = qkv[:, : (num_heads + kv_heads) * head_dim].view(num_tokens, num_heads + kv_heads, head_dim)
    qk = _rope(qk, cos, sin, interleaved)  # [T, H + KH, D]
    q, k = qk[:, :num_heads], qk[:, num_heads:]
    v = qkv[:, (num_heads + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)  # [T, KH, D]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)  # `write_kv`
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)
    if in_order:
        out = _attend(q, k_cache, v_cache, block_ids[0], num_seqs[0], masks[0], dims)
    else:
        out = torch.empty_like(q)  # [T, H, D]
        for i in range(len(token_index)):
            index = token_index[i]
            out[index] = _attend(q[index], k_cache, v_cache, block_ids[i], num_seqs[i], masks[i], dims)
    return out.reshape(num_tokens, num_heads * head_dim)


def _layer(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    w: List[Tensor],  # noqa: UP006
    kinds: List[int],  # noqa: UP006
    tiles: List[int],  # noqa: UP006
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    token_index: List[Tensor],  # noqa: UP006
    block_ids: List[Tensor],  # noqa: UP006
    num_seqs: List[int],  # noqa: UP006
    masks: List[Tensor],  # noqa: UP006
    in_order: bool,
    dims: List[int],  # noqa: UP006
    eps: float,
    interleaved: bool,
    dtype: torch.dtype,
) -> Tensor:
    # `LlamaDecoderLayer.forward`; w: [norm_in, norm_post, qkv a, b, o a, b, gate_up a, b, down a, b]
    hidden = [x.size(1)]
    h = torch.rms_norm(x, hidden, w[0], eps).to(dtype)
    qkv = _linear(kinds[0], w[2], w[3], h, tiles[0], tiles[1])
    out = _attention(
        qkv, cos, sin, k_cache, v_cache, slot_mapping, token_index, block_ids, num_seqs, masks, in_order,
        dims, interleaved,
    )  # fmt: skip
    x = x + _linear(kinds[1], w[4], w[5], out, tiles[2], tiles[3])
    h = torch.rms_norm(x, hidden, w[1], eps).to(dtype)
    gate_up = _linear(kinds[2], w[6], w[7], h, tiles[4], tiles[5]).chunk(2, dim=-1)
    return x + _linear(kinds[3], w[8], w[9], F.silu(gate_up[0]) * gate_up[1], tiles[6], tiles[7])


def _stack(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    weights: List[List[Tensor]],  # noqa: UP006
    kinds: List[List[int]],  # noqa: UP006
    tiles: List[List[int]],  # noqa: UP006
    k_caches: List[Tensor],  # noqa: UP006
    v_caches: List[Tensor],  # noqa: UP006
    slot_mapping: Tensor,
    token_index: List[Tensor],  # noqa: UP006
    block_ids: List[Tensor],  # noqa: UP006
    num_seqs: List[int],  # noqa: UP006
    masks: List[Tensor],  # noqa: UP006
    in_order: bool,
    dims: List[int],  # noqa: UP006
    eps: float,
    interleaved: bool,
    dtype: torch.dtype,
) -> Tensor:
    # x: [T, hidden] fp32 residual stream -> after the last layer (the final norm stays in LlamaModel)
    for i in range(len(weights)):
        x = _layer(
            x, cos, sin, weights[i], kinds[i], tiles[i], k_caches[i], v_caches[i], slot_mapping, token_index,
            block_ids, num_seqs, masks, in_order, dims, eps, interleaved, dtype,
        )  # fmt: skip
    return x


@functools.cache
def _scripted() -> torch.jit.ScriptFunction | None:
    """The compiled stack (once per process), or None where this torch cannot script it: the eager path serves."""
    try:
        declare_op()  # `_matmul` names the AMX int4 kernel's op
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.10+: deprecated, still supported
            return torch.jit.script(_stack)
    except Exception:  # a scripting failure only means the eager path
        _LOG.warning("TorchScript unavailable: the decoder layers run eagerly", exc_info=True)
        return None


@dataclass(frozen=True, slots=True)
class ScriptedStack:
    """The model's decoder layers flattened for `_stack` (`LlamaModel.scripted_stack` keeps it current)."""

    weights: list[list[Tensor]]  # per layer [norm_in, norm_post, qkv a, b, o a, b, gate_up a, b, down a, b]
    kinds: list[list[int]]
    tiles: list[list[int]]  # per layer (tile_rows, min_rows) x 4, zeros when not invariant
    dims: list[int]  # [H, KH, D]
    eps: float
    interleaved: bool
    dtype: torch.dtype
    attention_dtype: torch.dtype  # q's dtype (the QKV projection's output): the masks' dtype
    fn: torch.jit.ScriptFunction

    def run(self, x: Tensor, cos: Tensor, sin: Tensor, step: StepAttention) -> Tensor:
        """x: [T, hidden] fp32 residual stream after the embedding -> after the last decoder layer."""
        with torch.jit.optimized_execution(False):  # the graph as written: the eager ops, bit for bit
            out = self.fn(
                x, cos, sin, self.weights, self.kinds, self.tiles, step.k_caches, step.v_caches,
                step.slot_mapping, step.token_index, step.block_ids, step.num_seqs,
                step.masks(self.attention_dtype), step.in_order, self.dims, self.eps, self.interleaved,
                self.dtype,
            )  # fmt: skip
        assert isinstance(out, Tensor)
        return out


def build_stack(
    layers: Sequence[torch.nn.Module], config: LlamaConfig, dtype: torch.dtype, invariant: bool
) -> ScriptedStack | None:
    """The scripted stack of a CPU model's layers if `_matmul` knows every projection (else None: run eagerly)."""
    fn = _scripted()
    weights, kinds, tiles = [], [], []
    for layer in layers:
        assert isinstance(layer, LlamaDecoderLayer)
        linears = layer.linears()
        parts = [linear.script_parts() for linear in linears]
        if (
            fn is None
            or any(p is None for p in parts)
            or (invariant and any(lin.tiling is None for lin in linears))
        ):
            return None
        norms = [layer.input_layernorm.weight_f32(), layer.post_attention_layernorm.weight_f32()]
        weights.append(norms + [t for p in parts if p is not None for t in p[1:]])
        kinds.append([p[0] for p in parts if p is not None])
        tilings = [lin.tiling for lin in linears]
        tiles.append([n for t in tilings for n in ((t.tile_rows, t.min_rows) if invariant and t else (0, 0))])
    if fn is None or not kinds:
        return None
    # q's dtype is the QKV projection's output dtype: the quantized kernels give bf16
    attention_dtype = dtype if kinds[0][0] == MATMUL_DENSE else torch.bfloat16
    dims = [config.num_heads, config.num_kv_heads, config.head_dim]
    return ScriptedStack(
        weights, kinds, tiles, dims, config.rms_norm_eps, config.rope_interleaved, dtype, attention_dtype, fn
    )
