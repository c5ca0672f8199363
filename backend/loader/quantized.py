"""The GGUF's own 4-bit blocks, kept as codes + per-group scale and zero, so the model can pack them for
torch's CPU int4 kernel without re-quantizing (design §8).

One format covers both 4-bit block types: w = (code - 8) * scale + zero, group 32 along the input axis.
Q4_1 stores w = d * q + m: scale d, zero m + 8d. Q4_0 stores w = d * (q - 8): scale d, zero 0.
Other types (Q8_0, K-quants, F16) are not kept as blocks: the model quantizes their dequantized weights
itself (int8 per channel), see `backend.model.quant`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import torch

GROUP_SIZE = 32
# bytes per 32-weight block: fp16 d, [fp16 m,] 16 bytes of nibbles
_BLOCK_BYTES = {gguf.GGMLQuantizationType.Q4_0: 18, gguf.GGMLQuantizationType.Q4_1: 20}


@dataclass(frozen=True, slots=True)
class Int4Blocks:
    """A [N, K] weight as 4-bit codes: w[n, k] = (codes[n, k] - 8) * scales[n, k // 32] + zeros[n, k // 32]."""

    codes: torch.Tensor  # [N, K] uint8 in 0..15
    scales: torch.Tensor  # [N, K // 32] fp32
    zeros: torch.Tensor  # [N, K // 32] fp32

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        assert self.codes.dtype == torch.uint8 and k % GROUP_SIZE == 0, (self.codes.dtype, k)
        assert self.scales.shape == self.zeros.shape == (n, k // GROUP_SIZE)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def dequantize(self) -> torch.Tensor:
        """[N, K] fp32, the same numbers as gguf's own dequantization of the block."""
        n, k = self.shape
        codes = self.codes.view(n, k // GROUP_SIZE, GROUP_SIZE).float() - 8.0
        w = codes * self.scales[:, :, None] + self.zeros[:, :, None]  # [N, K/32, 32]
        return w.reshape(n, k)

    def rows(self, order: torch.Tensor) -> Int4Blocks:
        """The same weight with its rows permuted (for the Q/K un-permutation)."""
        return Int4Blocks(self.codes[order], self.scales[order], self.zeros[order])


def int4_blocks(
    raw: np.ndarray, kind: gguf.GGMLQuantizationType, shape: tuple[int, int]
) -> Int4Blocks | None:
    """The blocks of a Q4_0/Q4_1 tensor ([N, K] as numpy rows); None for any other type."""
    block_bytes = _BLOCK_BYTES.get(kind)
    if block_bytes is None:
        return None
    n, k = shape
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n * k // GROUP_SIZE, block_bytes)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]  # [nb]
    if kind == gguf.GGMLQuantizationType.Q4_1:
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
        zeros = m + 8.0 * d
    else:
        zeros = np.zeros_like(d)
    nibbles = blocks[:, block_bytes - 16 :]  # [nb, 16]: low nibbles are weights 0..15, high 16..31
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)  # [nb, 32]
    return Int4Blocks(
        codes=torch.from_numpy(codes.reshape(n, k)),
        scales=torch.from_numpy(d.reshape(n, k // GROUP_SIZE)),
        zeros=torch.from_numpy(zeros.reshape(n, k // GROUP_SIZE)),
    )
