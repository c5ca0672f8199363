"""The Triton kernel compiles for real GPUs on this CPU machine: Triton lowers it to PTX and its bundled ptxas to a
cubin for Ampere (sm80) and Hopper (sm90), no device needed. The interpreter tests (test_triton_attention.py) check
what the kernel computes; this checks that the GPU's compiler takes it (what the interpreter never sees: tensor
core dots, shared memory), at SmolLM2's and Llama's attention shapes. A subprocess, since the compiler needs the
kernel defined without TRITON_INTERPRET, which the interpreter tests set for this whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from backend.attention.triton_kernel import paged_attention_kernel as kernel

def compile(arch, dtype, head_dim, group, block_size):
    consts = dict(
        BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=1 << (group - 1).bit_length(), HEAD_DIM=head_dim,
        BLOCK_D=head_dim, BLOCK_M=16, BLOCK_N=64, MASK_SHIFT=0, PRECISION="ieee" if dtype == "fp32" else "tf32",
        UPCAST=False,
    )
    pointers = dict.fromkeys(["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"], "*" + dtype)
    pointers |= dict.fromkeys(["block_tables_ptr", "context_lens_ptr", "query_start_ptr"], "*i32")
    pointers["scale_log2"] = "fp32"
    signature = {n: pointers.get(n, "constexpr" if n in consts else "i32") for n in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=consts), target=GPUTarget("cuda", arch, 32))
    return {"cubin": len(compiled.asm["cubin"]), "mma": "mma" in compiled.asm["ptx"], "shared": compiled.metadata.shared}

print(json.dumps([compile(*case) for case in json.loads(sys.argv[1])]))
"""


CASES = {
    "sm90-bf16-smollm2": (90, "bf16", 64, 3, 16),
    "sm80-fp16-llama-flash-blocks": (80, "fp16", 128, 4, 256),
    "sm80-fp32-odd-blocks": (80, "fp32", 64, 1, 7),
}


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, int]]:
    """Every case compiled in one process (one torch import), without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, json.dumps(list(CASES.values()))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(CASES, json.loads(done.stdout.splitlines()[-1]), strict=True))


@pytest.mark.parametrize("case", CASES)
def test_the_kernel_compiles_to_a_cubin(compiled: dict[str, dict[str, int]], case: str) -> None:
    out, dtype = compiled[case], CASES[case][1]
    assert out["cubin"] > 0
    assert out["shared"] < 100 * 1024  # fits every GPU since Volta with room for two programs per SM
    assert out["mma"] == (dtype != "fp32")  # half precision on tensor cores; fp32 stays IEEE (no tf32)
