"""Quantized linear layers for the CPU: the GGUF's own 4-bit blocks on tokenedge's AMX kernel where it runs
(`backend.kernels`; else torch's int4 kernel), int8 per channel for everything else, and an int8 LM head whose
greedy pick is provably the fp32 head's.

Why: at batch 1 a decode step is memory-bound; the 120 layer GEMMs read 4x fewer bytes as int4 than as
bf16. The 4-bit blocks are packed as shipped (w = (code - 8) * scale + zero, group 32; see
`backend.loader.quantized`), never re-quantized. Layers the file does not store in 4 bits (Q8_0, F16,
safetensors checkpoints) are quantized at load to int8 with one scale per output row (relative error about
1/254 of each row's largest weight). Activations enter the kernels in bf16 and come back in bf16.

Row invariance: a token's output row must not depend on how many other rows share the matmul (the
batch-invariance contract, DESIGN §8). The AMX kernel is invariant by construction
(tests/backend/test_int4_kernel.py), torch's int4 and int8 kernels gave bitwise-equal rows for M = 1..64 on
every SmolLM2 layer shape (tests/backend/test_quant.py checks it); in the engine's invariant mode they still go
through the calibrated row tiling of backend/model/tiling.py like the dense layers, so a kernel that is
not invariant on some other machine is tiled, not trusted.

The LM head: an int8 copy (from 4 rows on the AMX int8 kernel where it runs, else a bf16 copy from 8 rows)
gives approximate logits; every token whose approximate logit could still be
the maximum (by an error bound computed from the row's own quantization error) is rescored exactly in
fp64 from the fp32 weights. The argmax of the result is the argmax of the exact logits, so greedy decoding
picks the fp32 head's token. Rows that sample (temperature > 0) get the plain fp32 head instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from backend.kernels import LANES, int4_kernel, pack_int4, pack_int8, require_amx
from backend.loader.quantized import GROUP_SIZE, Int4Blocks
from backend.model.layers import MATMUL_INT4, MATMUL_INT4_AMX, MATMUL_INT8, LlamaDecoderLayer, ScriptParts
from backend.model.tiling import RowTiling, TilingMemo, calibrate_tiling, tiled_rows

if TYPE_CHECKING:
    from backend.model.llama import LlamaModel

# inner K tiles of torch's CPU int4 packing (the only layout the CPU kernel reads)
_INNER_K_TILES = 2
# greedy rows from which the LM head approximates in bf16 instead of int8 (RescoredHead)
DENSE_ROWS = 8
# ... or on the AMX int8 kernel, where it runs: flat in the rows, cheaper than torch's int8 kernel from 4 rows
AMX_ROWS = 4


class QuantizedLinear(nn.Module):
    """The interface of `layers.TiledLinear`: forward(x, invariant) over `matmul`, tiled when invariant."""

    in_features: int
    out_features: int
    tiling: RowTiling | None = None

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def script_parts(self) -> ScriptParts | None:
        """This matmul for the scripted decoder stack (backend/model/scripted.py), None if it has none."""
        return None

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        if not invariant:
            return self.matmul(x)
        assert self.tiling is not None, "calibrate the model's tilings before an invariant forward"
        return tiled_rows(self.matmul, x, self.tiling)

    def calibrate(self, memo: TilingMemo) -> None:
        key = (self.out_features, self.in_features, f"{type(self).__name__}-{getattr(self, 'kernel', '')}")
        if key not in memo:
            # one-row calls allowed where they calibrate row-invariant (tiling.MIN_ROWS)
            memo[key] = calibrate_tiling(self.matmul, self.in_features, torch.bfloat16, "cpu", floor=1)
        self.tiling = memo[key]


class Int4Linear(QuantizedLinear):
    """y = x @ W.T with W as 4-bit codes and a (scale, zero) per group of 32 inputs, on tokenedge's AMX kernel
    (`backend.kernels`) where it runs, else torch's int4 kernel (packed codes, bf16 scales and zeros)."""

    def __init__(self, blocks: Int4Blocks, kernel: str | None = None) -> None:
        super().__init__()
        n, k = blocks.shape
        self.in_features, self.out_features = k, n
        self.kernel = kernel or int4_kernel()  # either kernel takes output columns in blocks of 16
        if self.kernel == "amx":
            require_amx()
            codes, factors = pack_int4(blocks.codes, blocks.scales, blocks.zeros)
            self.register_buffer("packed", codes)  # [N/16, K/32, 256] uint8
            self.register_buffer("factors", factors)  # [N/16, K/32, 2, 16] fp32
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

    def script_parts(self) -> ScriptParts:
        assert isinstance(self.packed, torch.Tensor) and isinstance(self.factors, torch.Tensor)
        return (MATMUL_INT4_AMX if self.kernel == "amx" else MATMUL_INT4), self.packed, self.factors


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (codes [N, K] int8, scales [N] fp32), w ~= codes * scale."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [N]
    codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


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

    def script_parts(self) -> ScriptParts:
        assert isinstance(self.codes, torch.Tensor) and isinstance(self.scales, torch.Tensor)
        return MATMUL_INT8, self.codes, self.scales


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


class RescoredHead:
    """Greedy-exact logits: approximate logits (int8 for a few rows, bf16 from `DENSE_ROWS` rows on), exact
    fp64 scores for every token that could be the max."""

    def __init__(self, weight: torch.Tensor, amx: bool | None = None) -> None:
        # weight: [V, H] fp32, the exact output matrix (kept for rescoring; may be shared with the model);
        # amx: approximate on the AMX int8 kernel from AMX_ROWS rows (None: where `int4_kernel()` is 'amx')
        assert weight.dtype == torch.float32 and weight.dim() == 2
        self.exact = weight
        self.codes, scales = quantize_int8(weight)
        self.scales = scales.to(torch.bfloat16)  # [V]
        approx = self.codes.float() * self.scales.float()[:, None]  # [V, H]
        self.weight_norm = weight.norm(dim=1)  # [V]
        self.err_norm = (approx - weight).norm(dim=1)  # [V]: ||w_hat - w|| per token
        self.approx_norm = approx.norm(dim=1)  # [V]
        # The int8 kernel's cost grows with the rows (it walks the weights once per few rows). From a few rows
        # on, the AMX int8 kernel (same codes and scales: the same w_hat, so the same bound) where it runs,
        # else oneDNN's bf16 GEMM (reads the weights once: cheaper from about 8 rows on, 49152 x 576, 2
        # threads). Either approximation only picks candidates, so the argmax is the exact one whichever ran.
        v, h = weight.shape
        self.amx: torch.Tensor | None = None
        self.dense: torch.Tensor | None = None
        if amx is None:
            amx = int4_kernel() == "amx"
        if amx and v % LANES == 0 and h % GROUP_SIZE == 0:
            require_amx()
            self.amx = pack_int8(self.codes)  # [V/16, H/32, 512]
            self.amx_scales = self.scales.float()  # the bf16 scales, exactly: w_hat as the int8 kernel's
            return
        self.dense = weight.to(torch.bfloat16)  # [V, H]
        dense = self.dense.float()
        self.dense_err_norm = (dense - weight).norm(dim=1)  # [V]
        self.dense_norm = dense.norm(dim=1)  # [V]

    def approximate(self, hb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Approximate logits [N, V] fp32 of bf16 rows, with the per-token norms of (w_hat - w) and w_hat."""
        rows = hb.shape[0]
        if self.amx is not None and rows >= AMX_ROWS:
            return torch.ops.tokenedge.int8_mm(hb, self.amx, self.amx_scales), self.err_norm, self.approx_norm
        if self.dense is not None and rows >= DENSE_ROWS:
            return F.linear(hb, self.dense).float(), self.dense_err_norm, self.dense_norm
        approx = torch.ops.aten._weight_int8pack_mm(hb, self.codes, self.scales).float()
        return approx, self.err_norm, self.approx_norm

    def greedy_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, V] fp32 whose row argmax is the exact argmax of hidden @ W.T (ties: the lowest id, as argmax)."""
        # hidden: [N, H] fp32
        hb = hidden.to(torch.bfloat16).contiguous()
        approx, err_norm, approx_norm = self.approximate(hb)  # [N, V]
        hbf = hb.float()
        h_norm = hbf.norm(dim=1, keepdim=True)  # [N, 1]
        delta = (hbf - hidden).norm(dim=1, keepdim=True)  # [N, 1]: the bf16 rounding of the activations
        # |approx - exact| <= |h_hat.(w_hat - w)| + |(h_hat - h).w| + accumulation + bf16 output rounding;
        # Cauchy-Schwarz on the first two, doubled for margin.
        bound = 2.0 * (h_norm * err_norm + delta * self.weight_norm + 1e-4 * h_norm * approx_norm)
        bound = bound + approx.abs() * 2.0**-7  # [N, V]
        floor = (approx - bound).amax(dim=1, keepdim=True)  # [N, 1]: a lower bound of each row's max
        rows, cols = torch.nonzero(approx + bound >= floor, as_tuple=True)  # candidates [C]
        exact = (self.exact[cols].double() * hidden[rows].double()).sum(dim=-1)  # [C]
        approx[rows, cols] = exact.float()
        # a non-candidate's approx < its exact upper bound < floor <= the best candidate's exact score
        return approx


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
    int4 kernel ('amx' or 'torch'; None: `backend.kernels.int4_kernel()`, the served choice)."""
    if model.device.type != "cpu":
        raise ValueError(
            "quantized weights use torch's CPU kernels: use --weights dequantized on this device"
        )
    quantize_layers(model, dense, blocks, kernel)
    model.head = RescoredHead(model.output_weight_fp32())
    model.projections_changed()  # re-calibrate and re-script: the linears changed
