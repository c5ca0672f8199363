"""Loading the built kernel into torch and deciding whether it is used: the library is built for the CPU's
tier (backend.kernels.build.isa: 'avx512' where it has AVX512-BF16 and AVX512-VNNI, 'avx2' where it has AVX2, FMA
and F16C) and loaded (registering `torch.ops.tokenedge.*`) where a self-check passes. The AVX512 build takes its
AMX paths (int4_mm from 4 rows, int8_mm) only where the CPU also has AMX (tile, int8, bf16), the VNNI ones for
every row count elsewhere (an AMD EPYC from Zen 4); the AVX2 build (an EPYC before Zen 4) its AVX2 paths for
every row count; anywhere else the model keeps torch's int4 kernel. Kernels and builds differ in their last
bits, so the kernel in use, its build and a hash of its source, is part of the served model revision
(`kernel_id`: 'torch', 'amx.<hash>' or 'avx2.<hash>').

'amx' names tokenedge's kernel library wherever it appears (`int4_kernel()`, `TOKENEDGE_INT4_KERNEL=amx`,
`Int4Linear.kernel`, `require_amx`, `amx_unavailable`), whatever ISA it was built for: the name predates the
AVX2 build, and callers compare to it. `isa()` says which build is loaded; `has_amx()` whether its AMX paths run.
`TOKENEDGE_INT4_KERNEL=torch` forces torch's kernel, `=amx` makes a failure to use this one an error.
`TOKENEDGE_STEP_THREADS` picks how the native decoder step and the head's VNNI rows spread over torch's threads
(team.h: `fork`, `pool` or `region`); every choice gives the same bits, so it is no part of the revision."""

from __future__ import annotations

import functools
import logging
import os
import subprocess

import torch

from backend.kernels import build as _build
from backend.kernels.build import build, source_hash
from backend.kernels.ops import int4_mm, pack_int4
from backend.runtime import cpu_flags

_LOG = logging.getLogger(__name__)
# the CPU features the AMX paths add to the AVX512 build (build.ISAS: each build's own)
_AMX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8")
# kernel_id's name of each build: the AVX512 build's ids are what they were before the AVX2 build existed
_ID_PREFIX = {"avx512": "amx", "avx2": "avx2"}
ENV = "TOKENEDGE_INT4_KERNEL"
KERNELS = ("auto", "amx", "torch")
THREADING_ENV = "TOKENEDGE_STEP_THREADS"
THREADINGS = ("fork", "pool", "region")
DEFAULT_THREADING = "region"  # measured best: docs/performance.md, "Threads"


class KernelUnavailable(RuntimeError):
    """`TOKENEDGE_INT4_KERNEL=amx` but the kernel cannot run here (the message says why)."""


def _tile_config(rows: int, a_bytes: int, b_rows: int) -> bytes:
    """The 64-byte AMX tile configuration int4_amx.cpp's `configure` loads: palette 1; C tiles 0-1 and A tiles
    2-3 of `rows` rows (64 and `a_bytes` bytes each), B tiles 4-5 of `b_rows` rows of 64 bytes."""
    colsb = [64, 64, a_bytes, a_bytes, 64, 64] + [0] * 10
    heights = [rows] * 4 + [b_rows] * 2 + [0] * 10
    return bytes([1] + [0] * 15) + b"".join(c.to_bytes(2, "little") for c in colsb) + bytes(heights)


def _self_check() -> None:
    """The tile configurations as the CPU holds them (GCC 12's intrinsic could drop their bytes: docs/design.md §8),
    one small product against the dequantized reference, and a row alone against the same row in a batch.
    `torch.ops.tokenedge.tile_config_roundtrip` is its debug entry: the 64 bytes read back from the CPU."""
    for shape in ((16, 32, 8), (16, 64, 16)) if has_amx() else ():  # int4_mm's AMX tiles, int8_mm's
        held = bytes(torch.ops.tokenedge.tile_config_roundtrip(*shape).tolist())
        if held != _tile_config(*shape):
            raise RuntimeError(f"the kernel's tile configuration {shape} reads back as {held.hex()}")
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 128), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(64, 4, generator=gen) * 0.1).half().float()  # Q4_1-like: fp16 d and m
    zeros = (torch.rand(64, 4, generator=gen) - 0.5).half().float() + 8 * scales
    weight = (codes.view(64, 4, 32).double() - 8) * scales[:, :, None] + zeros[:, :, None]  # [64, 4, 32]
    x = torch.randn(20, 128, generator=gen).to(torch.bfloat16)
    packed = pack_int4(codes, scales, zeros)
    y = int4_mm(x, *packed)
    ref = x.double() @ weight.view(64, 128).t()
    if not torch.allclose(y.double(), ref, rtol=2**-7, atol=1e-3):
        raise RuntimeError("the kernel's self-check disagreed with the dequantized reference")
    if not torch.equal(int4_mm(x[7:8], *packed), y[7:8]):
        raise RuntimeError("the kernel's self-check found a row that depends on its batch")


@functools.cache
def isa() -> str | None:
    """The library's build for this CPU: 'avx512' (AMX paths where `has_amx()`), 'avx2', or None (neither)."""
    return _build.isa()


@functools.cache
def has_amx() -> bool:
    """Whether the library takes its AMX paths: the AVX512 build on a CPU with AMX (int8_mm only there)."""
    return isa() == "avx512" and all(f in cpu_flags() for f in _AMX_FLAGS)


@functools.cache
def amx_unavailable() -> str | None:
    """Why tokenedge's kernel library (either build) cannot run here (None: built, loaded and self-checked)."""
    if isa() is None:
        missing = ", ".join(_build.missing_flags())
        return f"this CPU lacks {missing} (the kernel library needs AVX512-VNNI/BF16, or AVX2/FMA/F16C)"
    threading = step_threading()  # a misspelt choice is an error, not a fallback
    try:
        torch.ops.load_library(str(build(isa())))
        _self_check()
        torch.ops.tokenedge.set_step_threading(threading)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None


def step_threading() -> str:
    """How the native step spreads over the threads, by $TOKENEDGE_STEP_THREADS (team.h says what each does)."""
    choice = os.environ.get(THREADING_ENV, DEFAULT_THREADING).strip().lower() or DEFAULT_THREADING
    if choice not in THREADINGS:
        raise ValueError(f"{THREADING_ENV}={choice!r}: expected one of {', '.join(THREADINGS)}")
    return choice


@functools.cache
def int4_kernel() -> str:
    """'amx' (tokenedge's kernel library, built for this CPU's ISA and loaded: `isa()` says which build) or
    'torch' (torch's int4 kernel), by $TOKENEDGE_INT4_KERNEL."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in KERNELS:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(KERNELS)}")
    if choice == "torch":
        return "torch"
    why = amx_unavailable()
    if why is not None and choice == "amx":
        raise KernelUnavailable(f"{ENV}=amx but tokenedge's int4 kernel cannot run: {why}")
    if why is not None:
        _LOG.warning("tokenedge's int4 kernel is not used (%s): torch's int4 kernel instead", why)
    return "torch" if why is not None else "amx"


def kernel_id() -> str:
    """The int4 kernel in use, as the served revision names it: 'torch', or the library's build ('amx' for the
    AVX512 build, with or without AMX: the same bits; 'avx2' for the AVX2 build, whose fp32 bits may differ), a
    dot and a hash of its source (any change to its arithmetic is a new revision)."""
    if int4_kernel() == "torch":
        return "torch"
    return f"{_ID_PREFIX[isa() or 'avx512']}.{source_hash()}"


def require_amx() -> None:
    """Load the kernel for a layer that asks for it by name; KernelUnavailable if it cannot run here."""
    why = amx_unavailable()
    if why is not None:
        raise KernelUnavailable(f"tokenedge's int4 kernel cannot run here: {why}")
