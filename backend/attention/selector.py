"""Choose and build the attention backend: `auto` means flash-attn when it can run, else torch SDPA.

In batch-invariant mode (the default, DESIGN.md §8) every device gets the decode-shaped SDPA path of
backend/attention/invariant.py: flash-attn's decode kernel picks its KV splits from the batch size.
"""

from __future__ import annotations

from typing import Literal

import torch

from backend.attention.backend import AttentionBackend
from backend.attention.flash import FLASH_BLOCK_MULTIPLE, FlashBackend, flash_attn_available
from backend.attention.invariant import InvariantSdpaBackend
from backend.attention.sdpa import SdpaBackend

AttentionName = Literal["auto", "sdpa", "flash"]


def resolve_attention(
    requested: AttentionName, device: torch.device | str, dtype: torch.dtype, block_size: int
) -> Literal["sdpa", "flash"]:
    device = torch.device(device)
    flash_ok = (
        device.type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
        and block_size % FLASH_BLOCK_MULTIPLE == 0
        and flash_attn_available()
    )
    if requested == "flash" and not flash_ok:
        raise ValueError(
            "attention='flash' needs CUDA, the flash-attn package, fp16/bf16 weights and a block size "
            f"multiple of {FLASH_BLOCK_MULTIPLE} (device={device}, dtype={dtype}, block_size={block_size})"
        )
    if requested == "sdpa":
        return "sdpa"
    return "flash" if flash_ok else "sdpa"


def default_block_size(device: torch.device | str, dtype: torch.dtype) -> int:
    """256 where flash-attn can run (its paged kernels need a multiple of 256), else 16."""
    return (
        FLASH_BLOCK_MULTIPLE
        if resolve_attention("auto", device, dtype, FLASH_BLOCK_MULTIPLE) == "flash"
        else 16
    )


def make_attention_backend(
    requested: AttentionName,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
    batch_invariant: bool = False,
) -> AttentionBackend:
    if batch_invariant:
        if requested == "flash":
            raise ValueError(
                "attention='flash' is not batch-invariant: use 'auto' or turn batch_invariant off"
            )
        invariant = InvariantSdpaBackend(num_heads, num_kv_heads, head_dim, block_size)
        invariant.defer_calibration(dtype, device)
        return invariant
    name = resolve_attention(requested, device, dtype, block_size)
    if name == "flash":
        return FlashBackend(num_heads, num_kv_heads, head_dim, block_size)
    cuda_half = torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    return SdpaBackend(num_heads, num_kv_heads, head_dim, cuda_flash_prefill=cuda_half)
