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

arch, dtype, head_dim, group, block_size = json.loads(sys.argv[1])
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
print(json.dumps({"cubin": len(compiled.asm["cubin"]), "mma": "mma" in compiled.asm["ptx"],
                  "shared": compiled.metadata.shared}))
"""


@pytest.mark.parametrize(
    "arch, dtype, head_dim, group, block_size",
    [(90, "bf16", 64, 3, 16), (80, "fp16", 128, 4, 256), (80, "fp32", 64, 1, 7)],
    ids=["sm90-bf16-smollm2", "sm80-fp16-llama-flash-blocks", "sm80-fp32-odd-blocks"],
)
def test_the_kernel_compiles_to_a_cubin(
    arch: int, dtype: str, head_dim: int, group: int, block_size: int
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = json.dumps([arch, dtype, head_dim, group, block_size])
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["cubin"] > 0
    assert out["shared"] < 100 * 1024  # fits every GPU since Volta with room for two programs per SM
    assert out["mma"] == (dtype != "fp32")  # half precision on tensor cores; fp32 stays IEEE (no tf32)
