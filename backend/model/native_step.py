"""The decoder stack of an engine step as one native call (`backend/kernels/decoder_step.cpp`), where the model's
projections all run on tokenedge's int4 kernel: no Python, no dispatcher and no allocation between the ops.

The layers in `backend/model/layers.py` stay the model's one definition (the reference mode, every other weight
kind, CUDA, and the oracle the native step is tested against, tests/backend/test_native_step.py); the native
step computes the same math: the same int4 products, bit for bit, and its own rounding in the norms, the softmax
and SiLU (their order fixed per token, so batch-invariant by construction: the .cpp's header says why).
Measured before choosing it (SmolLM2 at batch 1, 1 thread, AMD EPYC): torch.compile (inductor, the int4
kernel as a custom op) of one layer ran 204 us against 146 eager, after 26 s of compilation per shape; the
TorchScript stack it replaces saved about a third of the eager step's overhead, this saves nearly all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.attention.context import AttentionContext
from backend.kernels.load import int4_kernel
from backend.model.config import LlamaConfig
from backend.model.layers import LlamaDecoderLayer


@dataclass(frozen=True, slots=True)
class PagedStep:
    """What the native step reads of an engine step: where the new tokens go and which blocks each reads."""

    ctx: AttentionContext
    k_caches: list[torch.Tensor]  # per layer [num_blocks, block_size, KH, D] bf16
    v_caches: list[torch.Tensor]


@dataclass(frozen=True, slots=True)
class NativeStack:
    """The model's decoder layers as the native step takes them (`LlamaModel.native_stack` keeps it current)."""

    weights: list[
        torch.Tensor
    ]  # per layer: norm_in, norm_post fp32, then (codes, factors) of qkv, o, gate_up, down
    dims: list[int]  # heads, KV heads, head dim, intermediate size
    eps: float

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: PagedStep) -> torch.Tensor:
        """x: [T, hidden] fp32 after the embedding -> [T, hidden] fp32 after the last decoder layer; the step's
        K/V written into the pool. cos, sin: [T, 1, D] (`RopeTable.lookup`, the half-split layout)."""
        ctx = step.ctx
        return torch.ops.tokenedge.decoder_step(
            x.contiguous(), cos.contiguous(), sin.contiguous(), ctx.slot_mapping, ctx.query_start_loc,
            ctx.context_lens, ctx.block_tables.contiguous(), step.k_caches, step.v_caches, self.weights,
            [*self.dims, ctx.block_size], self.eps,
        )  # fmt: skip


def build_native(layers: Sequence[torch.nn.Module], config: LlamaConfig) -> NativeStack | None:
    """The native stack of a CPU model whose every projection is on tokenedge's int4 kernel, else None (the
    eager layers serve)."""
    supported = (
        not config.rope_interleaved
        and config.head_dim % 16 == 0
        and config.head_dim <= 128
        and config.num_heads % config.num_kv_heads == 0
    )
    if not supported or not layers or int4_kernel() != "amx":
        return None
    weights: list[torch.Tensor] = []
    for layer in layers:
        assert isinstance(layer, LlamaDecoderLayer)
        # `quant.Int4Linear` on tokenedge's kernel, the one linear with kernel 'amx' (quant imports the model)
        linears = layer.linears()
        if not all(getattr(lin, "kernel", None) == "amx" for lin in linears):
            return None
        weights += [layer.input_layernorm.weight_f32(), layer.post_attention_layernorm.weight_f32()]
        for lin in linears:
            packed, factors = lin.get_buffer("packed"), lin.get_buffer("factors")
            assert packed.dim() == 4 and factors.dtype == torch.float16, "the kernel's own layout"
            weights += [packed, factors]
    dims = [config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size]
    return NativeStack(weights, dims, config.rms_norm_eps)


def sequence_step(
    num_tokens: int, block_size: int, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]
) -> PagedStep:
    """One sequence's first `num_tokens` tokens as one prefill over blocks 0, 1, ... of the given caches (tests
    and benchmarks run a whole text through the native step with it)."""
    blocks = -(-num_tokens // block_size)
    assert k_caches[0].shape[0] >= blocks, f"{num_tokens} tokens need {blocks} blocks"
    ctx = AttentionContext(
        slot_mapping=torch.arange(num_tokens),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None, :],
        context_lens=torch.tensor([num_tokens], dtype=torch.int32),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        query_lens=(num_tokens,),
        context_lens_host=(num_tokens,),
        block_size=block_size,
    )
    return PagedStep(ctx, k_caches, v_caches)
