"""The kernel's ops as Python calls them: the packed weight layouts `int4_amx.cpp` reads (`pack_int4`,
`pack_int8`, `pack_vnni`), the head's two-pass int8 rows (`vnni_rows`) and `int4_mm`. Packing is plain torch
and runs anywhere; the ops under `torch.ops.tokenedge` exist once `backend.kernels.load` has loaded the
library (`int4_kernel()`, `require_amx()`)."""

from __future__ import annotations

import torch

GROUP_SIZE = 32  # inputs per scale: GGUF's 4-bit blocks (backend.loader.quantized)
# columns per block and bytes per (block, group) of the packed layout (int4_amx.cpp: kLanes, kGroupBytes)
LANES = 16
_GROUP_BYTES = LANES * GROUP_SIZE // 2  # packed nibbles of one (block, group)


def pack_int4(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of w[n, k] = (codes[n, k] - 8) * scales[n, k // 32] + zeros[n, k // 32] ([N, K]
    uint8 codes, N a multiple of 16; [N, K/32] fp32 scales and zeros, as `Int4Blocks` holds them): codes
    [N/16, K/32, 8, 32] uint8, where the 32 bytes of quad j hold, for each of the 16 columns, k = 4j, 4j+1 in
    one byte's low and high nibbles and 4j+2, 4j+3 in the next; factors [N/16, K/32, 2, 16] fp16: the scales,
    then zero - 8 * scale (GGUF's d and m, or d and -8d: fp16 numbers, held exactly; halves the bytes a
    decode step reads for them, and a one-row step is bound by bytes). Where every zero is 0 (Q4_0), factors
    are [N/16, K/32, 1, 16], the scales alone: the kernel computes -8 * scale, the value the second plane
    would hold (int4_core.h: Panel), and a decode step streams 10% fewer bytes."""
    n, k = codes.shape
    groups, nb = k // GROUP_SIZE, n // LANES
    assert n % LANES == 0, f"{n} output columns: the kernel needs a multiple of {LANES}"
    c = codes.view(nb, LANES, groups, GROUP_SIZE // 4, 2, 2)  # [block, column, g, quad, byte, nibble]
    packed = c[..., 0] | (c[..., 1] << 4)  # [block, column, g, quad, byte]
    layout = packed.permute(0, 2, 3, 1, 4).contiguous().view(nb, groups, GROUP_SIZE // 4, 2 * LANES)
    planes = [scales.float()] if not zeros.any() else [scales.float(), zeros.float() - 8.0 * scales.float()]
    factors = torch.stack(planes).view(len(planes), nb, LANES, groups).permute(1, 3, 0, 2)
    return layout, factors.to(torch.float16).contiguous()


def pack_int8(codes: torch.Tensor) -> torch.Tensor:
    """The `int8_mm` layout of [N, K] int8 codes (N a multiple of 16, K of 32): [N/16, K/32, 512], each group
    one AMX B tile (16 k-pairs x 16 columns x the pair)."""
    n, k = codes.shape
    assert n % LANES == 0 and k % GROUP_SIZE == 0, (n, k)
    tiles = codes.view(n // LANES, LANES, k // GROUP_SIZE, GROUP_SIZE // 2, 2)  # [block, column, g, kp, pair]
    return tiles.permute(0, 2, 3, 1, 4).contiguous().view(n // LANES, k // GROUP_SIZE, 2 * _GROUP_BYTES)


def pack_vnni(codes: torch.Tensor) -> torch.Tensor:
    """The `int8_vnni` layout of [N, K] int8 codes (N a multiple of 16, K of 4): [N/16, K/4, 64], four
    consecutive k of each of 16 columns per 64 bytes."""
    n, k = codes.shape
    assert n % LANES == 0 and k % 4 == 0, (n, k)
    return (
        codes.view(n // LANES, LANES, k // 4, 4).permute(0, 2, 1, 3).contiguous().view(n // LANES, k // 4, 64)
    )


def vnni_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 rows [M, K] as `int8_vnni` takes them: u [M, 2, K] uint8 (q1 + 128, q2 + 128), row scales [M, 2]
    with row ~= s1 * q1 + s2 * q2 (q2 quantizes the residual of q1), and ||row - that|| [M, 1] in fp64."""
    s1 = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0  # [M, 1]
    q1 = torch.round(rows / s1).clamp(-127, 127)
    s2 = s1 / 127.0
    q2 = torch.round((rows - q1 * s1) / s2).clamp(-127, 127)  # |residual| <= s1 / 2: |q2| <= 64
    u = (torch.stack([q1, q2], dim=1) + 128).to(torch.uint8)  # [M, 2, K]
    scales = torch.cat([s1, s2], dim=1).contiguous()  # [M, 2]
    exact = q1.double() * s1.double() + q2.double() * s2.double()
    residual = (rows.double() - exact).norm(dim=1, keepdim=True).float() * (1 + 2**-20)  # rounded up
    return u, scales, residual


def int4_mm(x: torch.Tensor, codes: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """[M, K] (any float dtype) -> [M, N] bf16 through the kernel (load it first: `load.int4_kernel()`)."""
    return torch.ops.tokenedge.int4_mm(x.to(torch.bfloat16).contiguous(), codes, factors)
