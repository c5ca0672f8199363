"""Choose and build the attention backend. The choice is a pure function of the machine's facts (`Machine`) and
the request, so every rule is tested on a CPU; `machine()` gathers the facts once.

`auto` on CUDA: in batch-invariant mode (the default, docs/design.md §8) the Triton kernel (triton_paged.py), invariant
by construction and flash-style; else flash-attn where it can run, then Triton. flash-attn's decode kernel picks
its KV splits from the batch size, so it is never chosen (and refused when asked for) in batch-invariant mode;
where Triton cannot run either, torch SDPA (the decode-shaped invariant path in batch-invariant mode). On a CPU,
SDPA. The name `resolve_attention` returns is the family of the backend `make_attention_backend` builds
(`sdpa` covers `sdpa-invariant`), which is what `python -m backend` reports.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

import torch

from backend.attention.backend import AttentionBackend
from backend.attention.flash import FLASH_BLOCK_MULTIPLE, FlashBackend, flash_attn_available
from backend.attention.invariant import InvariantSdpaBackend
from backend.attention.sdpa import SdpaBackend
from backend.attention.triton_paged import TritonPagedBackend, interpreting

AttentionName = Literal["auto", "sdpa", "flash", "triton"]
Chosen = Literal["sdpa", "flash", "triton"]
HALF = (torch.float16, torch.bfloat16)
# flash-attn 2 runs on Ampere (sm80) and later, and refuses older cards at the first forward, not on import.
FLASH_MIN_CAPABILITY = (8, 0)
# Triton's tensor-core dot: fp16 and fp32 from Turing (sm75), bf16 from Ampere (sm80).
TRITON_MIN_CAPABILITY = (7, 5)
TRITON_BF16_CAPABILITY = (8, 0)


@dataclass(frozen=True, slots=True)
class Machine:
    """What the choice depends on: the device type, its CUDA capability and which kernels can be imported."""

    device_type: str
    capability: tuple[int, int] | None  # CUDA compute capability; None off CUDA
    flash_attn: bool  # the flash_attn package imports
    triton: bool  # triton is installed and can run here (CUDA, or its CPU interpreter)


def machine(device: torch.device | str) -> Machine:
    dev = torch.device(device)
    cuda = dev.type == "cuda" and torch.cuda.is_available()
    has_triton = importlib.util.find_spec("triton") is not None
    return Machine(
        device_type=dev.type,
        capability=torch.cuda.get_device_capability(dev) if cuda else None,
        flash_attn=cuda and flash_attn_available(),
        triton=has_triton and (cuda or (dev.type == "cpu" and interpreting())),
    )


def flash_unmet(m: Machine, dtype: torch.dtype, block_size: int) -> list[str]:
    """Why flash-attn cannot run here (empty: it can)."""
    unmet = []
    if m.device_type != "cuda":
        unmet.append(f"a CUDA device (got {m.device_type})")
    elif m.capability is None or m.capability < FLASH_MIN_CAPABILITY:
        unmet.append(f"compute capability >= {FLASH_MIN_CAPABILITY} (got {m.capability})")
    if not m.flash_attn:
        unmet.append("the flash-attn package")
    if dtype not in HALF:
        unmet.append(f"fp16/bf16 weights (got {dtype})")
    if block_size % FLASH_BLOCK_MULTIPLE:
        unmet.append(f"a block size multiple of {FLASH_BLOCK_MULTIPLE} (got {block_size})")
    return unmet


def triton_unmet(m: Machine, dtype: torch.dtype) -> list[str]:
    """Why the Triton kernel cannot run here (empty: it can)."""
    if not m.triton:
        return ["the triton package on a CUDA device (or TRITON_INTERPRET=1 on a CPU)"]
    if m.device_type != "cuda":
        return []  # the interpreter runs every dtype
    need = TRITON_BF16_CAPABILITY if dtype == torch.bfloat16 else TRITON_MIN_CAPABILITY
    if m.capability is None or m.capability < need:
        return [f"compute capability >= {need} for {dtype} (got {m.capability})"]
    return []


def choose_attention(
    requested: AttentionName, m: Machine, dtype: torch.dtype, block_size: int, batch_invariant: bool
) -> Chosen:
    """The backend family to build; ValueError when the one asked for cannot run (or is not invariant)."""
    if requested == "flash" and batch_invariant:
        raise ValueError("attention='flash' is not batch-invariant: use 'auto' or turn batch_invariant off")
    if requested in ("flash", "triton"):
        unmet = flash_unmet(m, dtype, block_size) if requested == "flash" else triton_unmet(m, dtype)
        if unmet:
            raise ValueError(f"attention={requested!r} needs {', '.join(unmet)}")
        return requested
    if requested == "sdpa" or m.device_type != "cuda":
        return "sdpa"
    if not batch_invariant and not flash_unmet(m, dtype, block_size):
        return "flash"
    return "triton" if not triton_unmet(m, dtype) else "sdpa"


def resolve_attention(
    requested: AttentionName,
    device: torch.device | str,
    dtype: torch.dtype,
    block_size: int,
    *,
    batch_invariant: bool = False,
) -> Chosen:
    return choose_attention(requested, machine(device), dtype, block_size, batch_invariant)


def default_block_size(device: torch.device | str, dtype: torch.dtype) -> int:
    """256 where flash-attn can run (its paged kernels need a multiple of 256), else 16."""
    return FLASH_BLOCK_MULTIPLE if not flash_unmet(machine(device), dtype, FLASH_BLOCK_MULTIPLE) else 16


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
    name = resolve_attention(requested, device, dtype, block_size, batch_invariant=batch_invariant)
    if name == "flash":
        return FlashBackend(num_heads, num_kv_heads, head_dim, block_size)
    if name == "triton":
        return TritonPagedBackend(num_heads, num_kv_heads, head_dim, block_size)
    if batch_invariant:
        invariant = InvariantSdpaBackend(num_heads, num_kv_heads, head_dim, block_size)
        invariant.defer_calibration(dtype, device)
        return invariant
    cuda_half = torch.device(device).type == "cuda" and dtype in HALF
    return SdpaBackend(num_heads, num_kv_heads, head_dim, cuda_flash_prefill=cuda_half)
