"""Rotary position embedding for both Q/K layouts, with optional Llama 3.1 frequency scaling.

Hugging Face checkpoints pair dimension d with d + D/2 (`rotate_half`); GGUF files as stored pair (2d, 2d+1)
(the loader un-permutes them to the HF layout, but `rope_interleaved` keeps the stored layout usable).
cos/sin come from one table over every position, computed once per model: a lookup gives a position the
same bits whatever else is in the step (cos/sin computed per step run vectorized or scalar by where an
element falls in the tensor, and the two differ in the last ulp). The rotation runs in fp32.
The half-split layout rotates as x * [cos | cos] + [x2 | x1] * [-sin | sin] from tables widened once: the
same bits as x1 * cos - x2 * sin, x2 * cos + x1 * sin (negation and a - b == a + (-b) are exact in IEEE), in
4 kernels a layer instead of 8 (the step is op-bound at batch 1).
"""

from __future__ import annotations

import math

import torch

from backend.model.config import Llama3RopeScaling


def inv_frequencies(head_dim: int, theta: float, scaling: Llama3RopeScaling | None) -> torch.Tensor:
    """[D/2] fp32 angular frequencies, Llama 3.1 scaled when configured (HF `rope_type: llama3`)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is not None:
        original = scaling.original_max_position_embeddings
        low_wavelen = original / scaling.low_freq_factor
        high_wavelen = original / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (original / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: [T] int64; inv_freq: [D/2] fp32
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    return freqs.cos()[:, None, :], freqs.sin()[:, None, :]  # [T, 1, D/2] each


class RopeTable:
    """cos/sin of every position below `max_positions`, computed once; `lookup` gathers a step's rows."""

    def __init__(self, max_positions: int, inv_freq: torch.Tensor) -> None:
        positions = torch.arange(max_positions, device=inv_freq.device)
        cos, sin = rope_cos_sin(positions, inv_freq)  # [P, 1, D/2] each
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        # the half-split layout's widened tables: [cos | cos], [-sin | sin], [P, 1, D] each
        self.cos_wide = torch.cat((cos, cos), dim=-1).contiguous()
        self.sin_wide = torch.cat((-sin, sin), dim=-1).contiguous()

    def lookup(self, positions: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] int64 -> cos, sin: [T, 1, D/2] each (interleaved) or [T, 1, D] widened (half split)
        if interleaved:
            return self.cos.index_select(0, positions), self.sin.index_select(0, positions)
        return self.cos_wide.index_select(0, positions), self.sin_wide.index_select(0, positions)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate q or k in fp32; returns x's dtype. cos, sin as `RopeTable.lookup` gives them for the layout."""
    # x: [T, heads, D]; cos, sin: [T, 1, D/2] (interleaved) or [T, 1, D] ([cos | cos], [-sin | sin])
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]  # [T, heads, D/2]: pairs (2d, 2d + 1)
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        half = xf.shape[-1] // 2
        swapped = torch.cat((xf[..., half:], xf[..., :half]), dim=-1)  # [x2 | x1]: pairs (d, d + D/2)
        out = xf * cos + swapped * sin
    return out.to(x.dtype)
