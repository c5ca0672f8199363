"""Compiling the kernel library (`SOURCES`, over the headers they share) on the machine that runs it: the
machine's g++ against the installed torch (about 8 s, once). The shared library is cached (`cache_dir`) by a hash
of the sources, torch's version, the compiler and the flags, so a change to any of them builds anew and an
unchanged toolchain never rebuilds.

One source, two builds (`ISAS`), chosen from the CPU (`isa()`): 'avx512' (AVX512-BF16/VNNI, and the AMX paths,
which run only where the CPU also has AMX) and 'avx2' (AVX2, FMA, F16C, BMI2: simd.h's two-halves types, no AMX).
The two give the same integer sums and may differ in the last bits of their fp32 arithmetic, so the served
kernel id names the build (backend.kernels.load.kernel_id)."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from backend.runtime import cpu_flags

_LOG = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("int4_amx.cpp")
# compiled together into one library; hashed with the header they share
SOURCES = (SOURCE, *(Path(__file__).with_name(n) for n in ("decoder_step.cpp", "rescore.cpp")))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("attend.h", "int4_core.h", "simd.h", "team.h"))
# per build: the CPU flags (/proc/cpuinfo) it needs, and the compiler's flags for it; the first the CPU has wins
ISAS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "avx512": (
        ("avx512_bf16", "avx512_vnni", "avx512bw", "avx512vl", "f16c"),
        [
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512bf16",
            "-mavx512vnni",
            "-mamx-tile",
            "-mamx-bf16",
            "-mamx-int8",
            "-mfma",
        ],
    ),
    "avx2": (("avx2", "fma", "f16c", "bmi2"), ["-mavx2", "-mfma", "-mf16c", "-mbmi2"]),
}


def isa(flags: set[str] | None = None) -> str | None:
    """The build this CPU runs ('avx512' or 'avx2', by `ISAS`), None where it has neither's flags."""
    have = cpu_flags() if flags is None else flags
    return next((name for name, (needs, _) in ISAS.items() if all(f in have for f in needs)), None)


def _torch_dir() -> Path:
    return Path(torch.__file__).parent


def _command(out: Path, target: str) -> list[str]:
    t = _torch_dir()
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{t / 'include'}", f"-I{t / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
    links = [f"-L{t / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{t / 'lib'}"]
    flags = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-w", abi, *ISAS[target][1]]
    return ["g++", *flags, *includes, *map(str, SOURCES), "-o", str(out), *links]


def cache_dir() -> Path:
    """Where built kernels live: $TOKENEDGE_KERNEL_CACHE, else ~/.cache/tokenedge/kernels."""
    configured = os.environ.get("TOKENEDGE_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tokenedge" / "kernels"


def _compiler() -> str:
    done = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0]


def build(target: str | None = None) -> Path:
    """The kernel's shared library for `target` (a key of `ISAS`; None: this CPU's, `isa()`), compiled now
    unless a build of this very source, toolchain and target exists. Any target compiles on any x86 machine;
    it runs only on a CPU with its flags."""
    target = target or isa()
    if target not in ISAS:
        raise RuntimeError(f"no kernel build for this CPU: it lacks {', '.join(missing_flags())}")
    key = hashlib.blake2b(digest_size=10)
    sources = [s.read_bytes() for s in (*SOURCES, *HEADERS)]
    for part in (*sources, torch.__version__.encode(), _compiler().encode()):
        key.update(part + b"\0")
    key.update(" ".join(_command(Path("out"), target)).encode())
    library = cache_dir() / f"int4_amx-{key.hexdigest()}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    _LOG.info("building the int4 kernel library (%s) into %s (once, about 10 s)", target, library)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        partial = Path(tmp) / library.name
        done = subprocess.run(_command(partial, target), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"g++ failed building {SOURCE.name} ({target}): {done.stderr.strip()[-2000:]}")
        os.replace(partial, library)  # atomic: a concurrent build of the same key wins or loses whole
    return library


def missing_flags() -> list[str]:
    """The CPU flags the least demanding build needs and this CPU lacks (none where `isa()` finds a build)."""
    needs = list(ISAS.values())[-1][0]
    return [f for f in needs if f not in cpu_flags()]


def source_hash() -> str:
    """A hash of this kernel's source: it names the kernel in the served revision and keys measurements of it
    (backend.model.tiling_store), without building or loading anything."""
    digest = hashlib.blake2b(digest_size=4)
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    return digest.hexdigest()
