"""tokenedge's own CPU kernels (`int4_amx.cpp`): 4-bit GGUF weights against activations quantized per row
and group in two int8 passes (`int4_mm`, the decoder's projections: AVX512-VNNI for 1-3 rows, AMX int8 tiles
from 4, the same integer sums), and int8 rows for the LM head's approximate logits (`int8_vnni` for 1-3 rows,
`int8_mm` on AMX bf16 tiles from 4).

Why: torch's `_weight_int4pack_mm_for_cpu` re-dequantizes the weights for every few rows, so its cost grows
with the rows (1.15x / 1.4x / 1.7x / 3x a one-row call at 2 / 3 / 4 / 8 rows, SmolLM2's shapes): continuous
batching hardly paid, and one row cost 5 ms over the 120 projections. Integer dot products of the codes as
stored (nibbles unpacked to bytes) with int8 inputs cost 3 ms for one row and 6.5 ms for 8 here. Each group's
sums are exact integers, so the two paths agree bitwise and every output element is one fixed sequence of
operations: batch-invariant by construction (see the .cpp). The inputs keep about 15 bits per group (two
int8 passes), finer than the bf16 they arrive in. The head's kernels only approximate: it rescores its
candidates exactly (backend.model.head.RescoredHead).

Built on the machine that runs it, with the machine's g++ against the installed torch (about 8 s, once; the
.so is cached by a hash of the source, torch's version, the compiler and the flags), used where the CPU has
AMX (tile, int8, bf16), AVX512-BF16 and AVX512-VNNI and a self-check passes. Anywhere else the model keeps
torch's int4 kernel: the two differ in their last bits, so the kernel in use, down to a hash of its source,
is part of the served model revision (`kernel_id`, `numerics`). `TOKENEDGE_INT4_KERNEL=torch` forces torch's
kernel, `=amx` makes a failure to use this one an error. `torch.ops.tokenedge.tile_config_roundtrip` is a
debug entry for tests: the 64-byte tile configuration the kernel loads, read back from the CPU.

    python -m backend.kernels       # build (if needed), self-check and print the kernel in use
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from backend.runtime import cpu_flags

_LOG = logging.getLogger(__name__)
GROUP_SIZE = 32  # inputs per scale: GGUF's 4-bit blocks (backend.loader.quantized)
_SOURCE = Path(__file__).with_name("int4_amx.cpp")
_CPU_FLAGS = ("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512vl")
_ISA = [
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512bf16",
    "-mavx512vnni",
    "-mamx-tile",
    "-mamx-bf16",
    "-mamx-int8",
    "-mfma",
]
ENV = "TOKENEDGE_INT4_KERNEL"
KERNELS = ("auto", "amx", "torch")
# columns per block and bytes per (block, group) of the packed layout (int4_amx.cpp: kLanes, kGroupBytes)
LANES = 16
_GROUP_BYTES = LANES * GROUP_SIZE // 2  # packed nibbles of one (block, group)


class KernelUnavailable(RuntimeError):
    """`TOKENEDGE_INT4_KERNEL=amx` but the kernel cannot run here (the message says why)."""


def _torch_dir() -> Path:
    return Path(torch.__file__).parent


def _command(out: Path) -> list[str]:
    t = _torch_dir()
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{t / 'include'}", f"-I{t / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
    links = [f"-L{t / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{t / 'lib'}"]
    flags = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-w", abi, *_ISA]
    return ["g++", *flags, *includes, str(_SOURCE), "-o", str(out), *links]


def cache_dir() -> Path:
    """Where built kernels live: $TOKENEDGE_KERNEL_CACHE, else ~/.cache/tokenedge/kernels."""
    configured = os.environ.get("TOKENEDGE_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tokenedge" / "kernels"


def _compiler() -> str:
    done = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0]


def build() -> Path:
    """The kernel's shared library, compiled now unless a build of this very source and toolchain exists."""
    key = hashlib.blake2b(digest_size=10)
    for part in (_SOURCE.read_bytes(), torch.__version__.encode(), _compiler().encode()):
        key.update(part + b"\0")
    key.update(" ".join(_command(Path("out"))).encode())
    target = cache_dir() / f"int4_amx-{key.hexdigest()}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _LOG.info("building the AMX int4 kernel into %s (once, about 10 s)", target)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        done = subprocess.run(_command(partial), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"g++ failed building {_SOURCE.name}: {done.stderr.strip()[-2000:]}")
        os.replace(partial, target)  # atomic: a concurrent build of the same key wins or loses whole
    return target


def pack_int4(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of w[n, k] = (codes[n, k] - 8) * scales[n, k // 32] + zeros[n, k // 32] ([N, K]
    uint8 codes, N a multiple of 16; [N, K/32] fp32 scales and zeros, as `Int4Blocks` holds them): codes
    [N/16, K/32, 8, 32] uint8, where the 32 bytes of quad j hold, for each of the 16 columns, k = 4j, 4j+1 in
    one byte's low and high nibbles and 4j+2, 4j+3 in the next; factors [N/16, K/32, 2, 16] fp16: the scales,
    then zero - 8 * scale (GGUF's d and m, or d and -8d: fp16 numbers, held exactly; halves the bytes a
    decode step reads for them, and a one-row step is bound by bytes)."""
    n, k = codes.shape
    groups, nb = k // GROUP_SIZE, n // LANES
    assert n % LANES == 0, f"{n} output columns: the kernel needs a multiple of {LANES}"
    c = codes.view(nb, LANES, groups, GROUP_SIZE // 4, 2, 2)  # [block, column, g, quad, byte, nibble]
    packed = c[..., 0] | (c[..., 1] << 4)  # [block, column, g, quad, byte]
    layout = packed.permute(0, 2, 3, 1, 4).contiguous().view(nb, groups, GROUP_SIZE // 4, 2 * LANES)
    zp = zeros.float() - 8.0 * scales.float()  # [N, G]
    factors = torch.stack([scales.float(), zp]).view(2, nb, LANES, groups).permute(1, 3, 0, 2)
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
    """[M, K] (any float dtype) -> [M, N] bf16 through the kernel (load it first: `int4_kernel()`)."""
    return torch.ops.tokenedge.int4_mm(x.to(torch.bfloat16).contiguous(), codes, factors)


def _tile_config(rows: int, a_bytes: int, b_rows: int) -> bytes:
    """The 64-byte AMX tile configuration int4_amx.cpp's `configure` loads: palette 1; C tiles 0-1 and A tiles
    2-3 of `rows` rows (64 and `a_bytes` bytes each), B tiles 4-5 of `b_rows` rows of 64 bytes."""
    colsb = [64, 64, a_bytes, a_bytes, 64, 64] + [0] * 10
    heights = [rows] * 4 + [b_rows] * 2 + [0] * 10
    return bytes([1] + [0] * 15) + b"".join(c.to_bytes(2, "little") for c in colsb) + bytes(heights)


def _self_check() -> None:
    """The tile configurations as the CPU holds them (GCC 12's intrinsic could drop their bytes: DESIGN.md §8),
    one small product against the dequantized reference, and a row alone against the same row in a batch."""
    for shape in ((16, 32, 8), (16, 64, 16)):  # int4_mm's AMX tiles at 8 rows, int8_mm's at 16
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
def amx_unavailable() -> str | None:
    """Why the AMX kernel cannot run here (None: built, loaded and self-checked)."""
    missing = [f for f in _CPU_FLAGS if f not in cpu_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    try:
        torch.ops.load_library(str(build()))
        _self_check()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None


@functools.cache
def int4_kernel() -> str:
    """'amx' (this kernel, built and loaded) or 'torch' (torch's int4 kernel), by $TOKENEDGE_INT4_KERNEL."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in KERNELS:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(KERNELS)}")
    if choice == "torch":
        return "torch"
    why = amx_unavailable()
    if why is not None and choice == "amx":
        raise KernelUnavailable(f"{ENV}=amx but the AMX int4 kernel cannot run: {why}")
    if why is not None:
        _LOG.warning("the AMX int4 kernel is not used (%s): torch's int4 kernel instead", why)
    return "torch" if why is not None else "amx"


def source_hash() -> str:
    """A hash of this kernel's source: it names the kernel in the served revision and keys measurements of it
    (backend.model.tiling_store), without building or loading anything."""
    return hashlib.blake2b(_SOURCE.read_bytes(), digest_size=4).hexdigest()


def kernel_id() -> str:
    """The int4 kernel in use, as the served revision names it: 'torch', or 'amx.' and a hash of this kernel's
    source (any change to its arithmetic is a new revision)."""
    if int4_kernel() == "torch":
        return "torch"
    return "amx." + source_hash()


def require_amx() -> None:
    """Load the kernel for a layer that asks for it by name; KernelUnavailable if it cannot run here."""
    why = amx_unavailable()
    if why is not None:
        raise KernelUnavailable(f"the AMX int4 kernel cannot run here: {why}")


_STUB: list[torch.library.Library] = []


def declare_op() -> None:
    """Make `torch.ops.tokenedge.int4_mm` known to TorchScript even where the kernel cannot load (the
    scripted stack names it; it is only called by layers packed for it)."""
    if _STUB or amx_unavailable() is None:
        return
    lib = torch.library.Library("tokenedge", "DEF")
    lib.define("int4_mm(Tensor x, Tensor codes, Tensor factors) -> Tensor")
    _STUB.append(lib)
