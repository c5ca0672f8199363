"""Quantized linear layers for the CPU: the GGUF's own 4-bit blocks on tokenedge's kernel (VNNI and AMX int8)
where it runs (`backend.kernels`; else torch's int4 kernel), int8 per channel for everything else, and an int8 LM head whose
greedy pick is provably the fp32 head's.

Why: at batch 1 a decode step is memory-bound; the 120 layer GEMMs read 4x fewer bytes as int4 than as
bf16. The 4-bit blocks are packed as shipped (w = (code - 8) * scale + zero, group 32; see
`backend.loader.quantized`), never re-quantized. Layers the file does not store in 4 bits (Q8_0, F16,
safetensors checkpoints) are quantized at load to int8 with one scale per output row (relative error about
1/254 of each row's largest weight). Activations enter the kernels in bf16 and come back in bf16.

Row invariance: a token's output row must not depend on how many other rows share the matmul (the
batch-invariance contract, design §8). Our kernel is invariant by construction
(tests/backend/test_int4_kernel.py), torch's int4 and int8 kernels gave bitwise-equal rows for M = 1..64 on
every SmolLM2 layer shape (tests/backend/test_quant.py checks it); in the engine's invariant mode they still go
through the calibrated row tiling of backend/model/tiling.py like the dense layers, so a kernel that is
not invariant on some other machine is tiled, not trusted.

The LM head is `backend.model.head.RescoredHead`: approximate int8 logits, every candidate rescored exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from backend.kernels.load import int4_kernel, require_amx
from backend.kernels.ops import pack_int4
from backend.loader.quantized import GROUP_SIZE, Int4Blocks
from backend.model.head import RescoredHead, quantize_int8
from backend.model.layers import LlamaDecoderLayer
from backend.model.tiling import Calibrate, RowTiling, TilingMemo, calibrate_tiling, tiled_rows

if TYPE_CHECKING:
    from backend.model.llama import LlamaModel

# inner K tiles of torch's CPU int4 packing (the only layout the CPU kernel reads)
_INNER_K_TILES = 2


class QuantizedLinear(nn.Module):
    """The interface of `layers.TiledLinear`: forward(x, invariant) over `matmul`, tiled when invariant."""

    in_features: int
    out_features: int
    tiling: RowTiling | None = None
    kernel = "torch"  # whose kernel runs the matmul: 'torch', or 'amx' (backend.kernels) for Int4Linear

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        if not invariant:
            return self.matmul(x)
        assert self.tiling is not None, "calibrate the model's tilings before an invariant forward"
        return tiled_rows(self.matmul, x, self.tiling)

    def calibrate(self, memo: TilingMemo, measure: Calibrate = calibrate_tiling) -> None:
        key = (self.out_features, self.in_features, f"{type(self).__name__}-{self.kernel}")
        if key not in memo:
            # one-row calls allowed where they calibrate row-invariant (tiling.MIN_ROWS)
            memo[key] = measure(self.matmul, self.in_features, torch.bfloat16, "cpu", floor=1)
        self.tiling = memo[key]


class Int4Linear(QuantizedLinear):
    """y = x @ W.T with W as 4-bit codes and a (scale, zero) per group of 32 inputs, on tokenedge's kernel
    (`backend.kernels`, kernel 'amx') where it runs, else torch's int4 kernel (packed codes, bf16 scales and
    zeros)."""

    def __init__(self, blocks: Int4Blocks, kernel: str | None = None) -> None:
        super().__init__()
        n, k = blocks.shape
        self.in_features, self.out_features = k, n
        self.kernel = kernel or int4_kernel()  # either kernel takes output columns in blocks of 16
        if self.kernel == "amx":
            require_amx()
            codes, factors = pack_int4(blocks.codes, blocks.scales, blocks.zeros)
            self.register_buffer("packed", codes)  # [N/16, K/32, 8, 32] uint8 nibbles
            self.register_buffer("factors", factors)  # [N/16, K/32, 2 or 1, 16] fp16 scales (and zero points)
            return
        # packed: torch's CPU layout of the [N, K] codes; factors: [K / 32, N, 2] bf16 scales and zeros
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(blocks.codes.int(), _INNER_K_TILES)
        )
        sz = torch.stack([blocks.scales.t(), blocks.zeros.t()], dim=-1)  # [K/32, N, 2]
        self.register_buffer("factors", sz.to(torch.bfloat16).contiguous())

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        # rows: [M, K] -> [M, N] bf16
        if self.kernel == "amx":
            return torch.ops.tokenedge.int4_mm(rows.to(torch.bfloat16), self.packed, self.factors)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.to(torch.bfloat16), self.packed, GROUP_SIZE, self.factors
        )


class Int8Linear(QuantizedLinear):
    """y = x @ W.T with W as int8 codes and one bf16 scale per output row (`_weight_int8pack_mm`)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        codes, scales = quantize_int8(weight.float())
        self.register_buffer("codes", codes)  # [N, K] int8
        self.register_buffer("scales", scales.to(torch.bfloat16))  # [N]

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        # rows: [M, K] -> [M, N] bf16
        return torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), self.codes, self.scales)


def quantized_linear(
    dense: list[torch.Tensor], parts: list[Int4Blocks | None], kernel: str | None = None
) -> QuantizedLinear:
    """Int4 when every fused part came as 4-bit blocks (rows concatenated in order; `kernel` as
    `Int4Linear`'s), else int8 of the concatenated dense weights."""
    blocks = [p for p in parts if p is not None]
    if blocks and len(blocks) == len(parts):
        return Int4Linear(
            Int4Blocks(
                codes=torch.cat([b.codes for b in blocks]),
                scales=torch.cat([b.scales for b in blocks]),
                zeros=torch.cat([b.zeros for b in blocks]),
            ),
            kernel,
        )
    return Int8Linear(torch.cat(dense).float())


def quantize_layers(
    model: LlamaModel,
    dense: Mapping[str, torch.Tensor],
    blocks: Mapping[str, Int4Blocks],
    kernel: str | None = None,
) -> None:
    """Swap every decoder projection of `model` for its quantized twin (int4 from blocks, else int8)."""
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, LlamaDecoderLayer)
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        fused = {
            (attn, "qkv_proj"): ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            (attn, "o_proj"): ["self_attn.o_proj"],
            (mlp, "gate_up_proj"): ["mlp.gate_proj", "mlp.up_proj"],
            (mlp, "down_proj"): ["mlp.down_proj"],
        }
        for (module, attr), names in fused.items():
            weights = [dense[p + n + ".weight"] for n in names]
            parts = [blocks.get(p + n + ".weight") for n in names]
            setattr(module, attr, quantized_linear(weights, parts, kernel))


def quantize_model(
    model: LlamaModel,
    dense: Mapping[str, torch.Tensor],
    blocks: Mapping[str, Int4Blocks],
    kernel: str | None = None,
) -> None:
    """Quantize a loaded CPU model in place: decoder projections and a greedy-exact LM head. `kernel`: the
    int4 kernel ('amx' or 'torch'; None: `backend.kernels.load.int4_kernel()`, the served choice)."""
    if model.device.type != "cpu":
        raise ValueError(
            "quantized weights use torch's CPU kernels: use --weights dequantized on this device"
        )
    quantize_layers(model, dense, blocks, kernel)
    model.head = RescoredHead(model.output_weight_fp32())
    model.projections_changed()  # re-calibrate and re-script: the linears changed
