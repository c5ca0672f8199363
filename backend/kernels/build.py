"""Compiling the kernel library (`SOURCES`, over the header they share) on the machine that runs it: the
machine's g++ against the installed torch (about 8 s, once). The shared library is cached (`cache_dir`) by a hash
of the sources, torch's version, the compiler and the flags, so a change to any of them builds anew and an
unchanged toolchain never rebuilds."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import torch

_LOG = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("int4_amx.cpp")
# compiled together into one library; hashed with the header they share
SOURCES = (SOURCE, *(Path(__file__).with_name(n) for n in ("decoder_step.cpp", "rescore.cpp")))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("int4_core.h", "team.h"))
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


def _torch_dir() -> Path:
    return Path(torch.__file__).parent


def _command(out: Path) -> list[str]:
    t = _torch_dir()
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{t / 'include'}", f"-I{t / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
    links = [f"-L{t / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{t / 'lib'}"]
    flags = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-w", abi, *_ISA]
    return ["g++", *flags, *includes, *map(str, SOURCES), "-o", str(out), *links]


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
    sources = [s.read_bytes() for s in (*SOURCES, *HEADERS)]
    for part in (*sources, torch.__version__.encode(), _compiler().encode()):
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
            raise RuntimeError(f"g++ failed building {SOURCE.name}: {done.stderr.strip()[-2000:]}")
        os.replace(partial, target)  # atomic: a concurrent build of the same key wins or loses whole
    return target


def source_hash() -> str:
    """A hash of this kernel's source: it names the kernel in the served revision and keys measurements of it
    (backend.model.tiling_store), without building or loading anything."""
    digest = hashlib.blake2b(digest_size=4)
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    return digest.hexdigest()
