"""Llama building blocks: RMSNorm, the attention projections and the SwiGLU MLP.

Precision policy: the residual stream arrives in fp32; norms compute in fp32 and hand the projections
their input in the weight dtype (bf16 or fp32); projection outputs go back to fp32 before they are added
to the residual. Attention itself is a callback so the same layer serves the paged engine and the
full-recompute reference.
Batch invariance: with `invariant=True` every projection runs its rows through `tiled_rows` (see
backend/model/tiling.py), so a token's row never sees a GEMM shape chosen by the rest of the batch. RMSNorm
(a per-row reduction over the hidden size), SiLU and the residual adds are row-local already: tested over
1..600 rows in tests/backend/test_batch_invariance.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from backend.model.config import LlamaConfig
from backend.model.rope import apply_rope
from backend.model.tiling import Calibrate, RowTiling, TilingMemo, calibrate_tiling, tiled_rows

# (q [T, H, D], k [T, KH, D], v [T, KH, D]) -> [T, H, D]; k/v are the new tokens only.
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TiledLinear(nn.Linear):
    """A bias-free linear that, asked for invariance, runs its rows in calibrated tiles."""

    tiling: RowTiling | None = None

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        if not invariant:
            return self.matmul(x)
        assert self.tiling is not None, "calibrate the model's tilings before an invariant forward"
        return tiled_rows(self.matmul, x, self.tiling)

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows, self.weight)  # [M, in] -> [M, out]

    def calibrate(self, memo: TilingMemo, measure: Calibrate = calibrate_tiling) -> None:
        """Measure this shape's tiling once per model (`memo` shares it between layers of one shape and holds
        what the tiling store read back from an earlier start)."""
        key = (self.out_features, self.in_features, str(self.weight.dtype))
        if key not in memo:
            memo[key] = measure(self.matmul, self.in_features, self.weight.dtype, self.weight.device)
        self.tiling = memo[key]


def _linear(
    in_features: int, out_features: int, dtype: torch.dtype, device: str | torch.device
) -> TiledLinear:
    layer = TiledLinear(in_features, out_features, bias=False, dtype=dtype, device=device)
    layer.weight.requires_grad_(False)
    return layer


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device), requires_grad=False)
        self._weight_f32: tuple[int, torch.Tensor] | None = None  # (weight._version, fp32 copy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] fp32 -> [T, hidden] fp32 (F.rms_norm: the same ops and bits as the written-out norm)
        assert x.dtype == torch.float32, "the residual stream is fp32"
        return F.rms_norm(x, self.weight.shape, self.weight_f32(), self.eps)

    def weight_f32(self) -> torch.Tensor:
        """The weight in fp32, cast once per load (the version counter moves when load_weights copies in)."""
        version = self.weight._version
        if self._weight_f32 is None or self._weight_f32[0] != version:
            self._weight_f32 = (version, self.weight.float())
        return self._weight_f32[1]


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.rope_interleaved = config.rope_interleaved
        hidden, q_dim, kv_dim = config.hidden_size, config.q_size, config.kv_size
        # Q, K and V fused in one matmul; rows [q | k | v] (load_weights fills each part by its HF name)
        self.qkv_proj = _linear(hidden, q_dim + 2 * kv_dim, dtype, device)
        self.o_proj = _linear(q_dim, hidden, dtype, device)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn, invariant: bool = False
    ) -> torch.Tensor:
        # h: [T, hidden] in the weight dtype
        num_tokens, heads, kv_heads, head_dim = h.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj.forward(h, invariant)  # [T, (H + 2 KH) * D]
        # q and k rotated in one pass: they are adjacent in the fused output
        qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
        qk = apply_rope(qk, cos, sin, self.rope_interleaved)  # [T, H + KH, D]
        q, k = qk[:, :heads], qk[:, heads:]  # q: [T, H, D], k: [T, KH, D]
        v = qkv[:, (heads + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)  # [T, KH, D]
        out = attend(q, k, v)  # out: [T, H, D]
        assert out.shape == q.shape, f"attention returned {tuple(out.shape)}, expected {tuple(q.shape)}"
        return self.o_proj.forward(out.reshape(num_tokens, heads * head_dim), invariant)  # [T, hidden]


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        # gate and up fused in one matmul; rows [gate | up]
        self.gate_up_proj = _linear(config.hidden_size, 2 * config.intermediate_size, dtype, device)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, dtype, device)

    def forward(self, h: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        # h: [T, hidden] -> SwiGLU: down(silu(gate(h)) * up(h)) -> [T, hidden]
        gate, up = self.gate_up_proj.forward(h, invariant).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj.forward(F.silu(gate) * up, invariant)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        self.dtype = dtype
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(config, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(config, dtype, device)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn, invariant: bool = False
    ) -> torch.Tensor:
        # x: [T, hidden] fp32 residual stream; a half-precision branch output is widened inside the add
        # (exact, the same bits as adding its fp32 copy)
        # (submodules' `forward` called directly: no hooks here, and __call__ costs ~9 x 30 calls a step)
        h = self.input_layernorm.forward(x).to(self.dtype)
        x = x + self.self_attn.forward(h, cos, sin, attend, invariant)
        h = self.post_attention_layernorm.forward(x).to(self.dtype)
        return x + self.mlp.forward(h, invariant)

    def linears(self) -> tuple[TiledLinear, ...]:
        attn, mlp = self.self_attn, self.mlp
        return (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
