"""llama.cpp as a benchmark peer: `llama-cpp-python` built once into its own venv (bench/.venv-llamacpp, or
$TOKENEDGE_LLAMACPP_VENV), never a tokenedge dependency, driven through `llamacpp_worker.py` in a subprocess.

The build takes minutes on 2 cores. On CPUs with AMX the native build died with `Illegal instruction` at
load (design §8), so there it is built for AVX2/FMA/F16C, which is what the table then reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from backend.runtime import cpu_flags

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("TOKENEDGE_LLAMACPP_VENV", ROOT / "bench" / ".venv-llamacpp"))
PORTABLE = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"


def build_flags() -> str:
    """The CMAKE_ARGS the peer is built with: portable AVX2 where AMX is present, native elsewhere."""
    return PORTABLE if "amx_tile" in cpu_flags() else ""


def ensure_venv() -> Path:
    """The venv's python, building llama-cpp-python into it on first use (minutes)."""
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    env = {**os.environ, "CMAKE_ARGS": build_flags(), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    print(f"building llama-cpp-python into {VENV} (CMAKE_ARGS={env['CMAKE_ARGS']!r}); minutes", flush=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "llama-cpp-python"], env=env, check=True)
    return python


class LlamaCpp:
    """One llama.cpp model in the bench venv; each call is one measurement."""

    def __init__(self, model_path: Path, threads: int) -> None:
        worker = Path(__file__).with_name("llamacpp_worker.py")
        self.proc = subprocess.Popen(
            [str(ensure_venv()), str(worker), str(model_path), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._read()
        self.system_info = str(hello.get("system_info", ""))
        self.build = build_flags() or "native"

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp worker exited")
        return dict(json.loads(line))

    def _call(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()["result"]

    def batch1(self, ids: list[int], new_tokens: int) -> float:
        return float(self._call(op="batch1", ids=ids, n=new_tokens))

    def prefill(self, ids: list[int]) -> float:
        return float(self._call(op="prefill", ids=ids))

    def argmax(self, ids: list[int]) -> list[int]:
        return list(self._call(op="argmax", ids=ids))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
