"""The quantized LM head whose greedy pick is provably the fp32 head's (`RescoredHead`).

Approximate logits come from an int8 copy of the output matrix (one scale per token row); every token whose
approximate logit could still be the maximum, by an error bound computed from the row's own quantization
error, is rescored exactly in fp64 from the fp32 weights. The argmax of the result is the argmax of the exact
logits, so greedy decoding picks the fp32 head's token, whichever approximation ran. Rows that sample
(temperature > 0) get the plain fp32 head instead (backend.model.llama).

Approximations, by rows in the call (the cheapest measured for each; 49152 x 576, 2 threads):
- 1 to 3 rows, where the kernel library runs: AVX512-VNNI (AVX2's vpmaddubsw in its AVX2 build) on the int8
  codes and the activation row as two int8 passes (its value, then its residual: about 16 bits), exact integer
  sums (`backend.kernels.int8_vnni`);
- from 4 rows there: the AMX int8 kernel (`int8_mm`), flat in the rows, where the CPU has AMX (`has_amx()`:
  never the AVX2 build); int8_vnni otherwise (an AMD EPYC: 1 thread, 1 row 0.9 ms against torch's int8
  kernel's 2.0);
- elsewhere: torch's `_weight_int8pack_mm` below `DENSE_ROWS`, oneDNN's bf16 GEMM from there.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from backend.kernels.load import has_amx, int4_kernel, require_amx
from backend.kernels.ops import GROUP_SIZE, LANES, pack_int8, pack_vnni, vnni_rows

# greedy rows from which the head approximates in bf16 instead of int8 (no AMX kernel library)
DENSE_ROWS = 8
# greedy rows from which the head approximates on the AMX int8 kernel (below: VNNI), where it runs
AMX_ROWS = 4


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (codes [N, K] int8, scales [N] fp32), w ~= codes * scale."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [N]
    codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


class RescoredHead:
    """Greedy-exact logits: approximate int8 logits, exact fp64 scores for every token that could be the max."""

    def __init__(self, weight: torch.Tensor, amx: bool | None = None) -> None:
        # weight: [V, H] fp32, the exact output matrix (kept for rescoring; may be shared with the model);
        # amx: use the AMX kernel library's approximations (None: where `int4_kernel()` is 'amx')
        assert weight.dtype == torch.float32 and weight.dim() == 2
        self.exact = weight
        self.codes, scales = quantize_int8(weight)
        self.scales = scales.to(torch.bfloat16)  # [V]: w_hat = codes * these, for every approximation
        approx = self.codes.float() * self.scales.float()[:, None]  # [V, H]
        self.weight_norm = weight.norm(dim=1)  # [V]
        self.err_norm = (approx - weight).norm(dim=1)  # [V]: ||w_hat - w|| per token
        self.approx_norm = approx.norm(dim=1)  # [V]
        v, h = weight.shape
        self.amx: torch.Tensor | None = None  # the AMX int8 layout, where the library runs its AMX paths
        self.vnni: torch.Tensor | None = None
        self.dense: torch.Tensor | None = None
        if amx is None:
            amx = int4_kernel() == "amx"
        if amx and v % LANES == 0 and h % GROUP_SIZE == 0:
            require_amx()
            if has_amx():
                self.amx = pack_int8(self.codes)  # [V/16, H/32, 512]
            self.vnni = pack_vnni(self.codes)  # [V/16, H/4, 64]
            self.colsum = self.codes.sum(dim=1, dtype=torch.int32)  # [V]
            self.fp32_scales = self.scales.float()  # the bf16 scales, exactly
            return
        self.dense = weight.to(torch.bfloat16)  # [V, H]
        dense = self.dense.float()
        self.dense_err_norm = (dense - weight).norm(dim=1)  # [V]
        self.dense_norm = dense.norm(dim=1)  # [V]

    def approximate(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(approximate logits [N, V] fp32, a bound [N, V] on |approximate - exact|) for fp32 rows."""
        rows = hidden.shape[0]
        h_norm = hidden.norm(dim=1, keepdim=True)  # [N, 1]
        if self.vnni is not None and (self.amx is None or rows < AMX_ROWS):
            u, row_scales, residual = vnni_rows(hidden)
            approx = torch.ops.tokenedge.int8_vnni(u, row_scales, self.vnni, self.colsum, self.fp32_scales)
            # |w_hat.x_q - w.h| <= ||w_hat|| ||x_q - h|| + ||w_hat - w|| ||h||; integer sums are exact and the
            # last fp32 products a few ulp; doubled for margin
            bound = 2.0 * (
                residual * self.approx_norm + h_norm * self.err_norm + 1e-4 * h_norm * self.approx_norm
            )
            return approx, bound
        hb = hidden.to(torch.bfloat16).contiguous()
        err_norm, approx_norm = self.err_norm, self.approx_norm
        if self.amx is not None:
            approx = torch.ops.tokenedge.int8_mm(hb, self.amx, self.fp32_scales)
        elif self.dense is not None and rows >= DENSE_ROWS:
            approx = F.linear(hb, self.dense).float()
            err_norm, approx_norm = self.dense_err_norm, self.dense_norm
        else:
            approx = torch.ops.aten._weight_int8pack_mm(hb, self.codes, self.scales).float()
        delta = (hb.float() - hidden).norm(dim=1, keepdim=True)  # [N, 1]: the bf16 rounding of the rows
        # |approx - exact| <= |h_hat.(w_hat - w)| + |(h_hat - h).w| + accumulation + bf16 output rounding;
        # Cauchy-Schwarz on the first two, doubled for margin
        bound = 2.0 * (h_norm * err_norm + delta * self.weight_norm + 1e-4 * h_norm * approx_norm)
        return approx, bound + approx.abs() * 2.0**-7

    def greedy_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, V] fp32 whose row argmax is the exact argmax of hidden @ W.T (ties: the lowest id, as argmax)."""
        # hidden: [N, H] fp32
        approx, bound = self.approximate(hidden)  # [N, V]
        if (
            self.vnni is not None
        ):  # the kernel library's pass: the same candidates, each in one fixed fp64 order
            torch.ops.tokenedge.rescore(approx, bound.contiguous(), hidden.contiguous(), self.exact)
            return approx
        floor = (approx - bound).amax(dim=1, keepdim=True)  # [N, 1]: a lower bound of each row's max
        rows, cols = torch.nonzero(approx + bound >= floor, as_tuple=True)  # candidates [C]
        exact = (self.exact[cols].double() * hidden[rows].double()).sum(dim=-1)  # [C]
        approx[rows, cols] = exact.float()
        # a non-candidate's approx < its exact upper bound < floor <= the best candidate's exact score
        return approx
