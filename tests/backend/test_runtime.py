"""backend/runtime.py: the start-up description of device, dtype, threads and kernels is what torch really runs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from backend.runtime import describe_runtime, log_runtime

_ONEDNN_PROBE = """
import torch
w = torch.randn(64, 64, dtype=torch.bfloat16)
torch.nn.functional.linear(torch.randn(4, 64, dtype=torch.bfloat16), w)
"""


def test_the_description_reports_device_dtype_threads_and_kernels() -> None:
    info = describe_runtime("cpu", torch.bfloat16, "sdpa")
    assert info["device"] == "cpu" and info["dtype"] == "bfloat16" and info["logits_dtype"] == "float32"
    assert info["threads"] == torch.get_num_threads() and info["attention"] == "sdpa"
    assert info["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cpu"]["amx_tile"] == torch.cpu._is_amx_tile_supported()
    assert set(info["sdpa_kernels"]) == {"prefill", "decode"}
    assert "unknown" not in info["sdpa_kernels"].values()
    assert describe_runtime("cpu", torch.float32, "sdpa")["matmul"].endswith("sgemm fp32")


def test_the_bf16_matmul_label_names_the_isa_onednn_really_runs() -> None:
    """oneDNN's own verbose log names the implementation it executed (e.g. `brg_matmul:avx10_1_512_amx`)."""
    label = describe_runtime("cpu", torch.bfloat16, "sdpa")["matmul"]
    run = subprocess.run(
        [sys.executable, "-c", _ONEDNN_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ONEDNN_VERBOSE": "1"},
        check=True,
    )
    executed = [line for line in run.stdout.splitlines() if ",exec,cpu," in line and "matmul" in line]
    if not label.startswith("oneDNN"):  # a CPU without oneDNN bf16: torch must not have used it
        assert not executed, (label, executed)
        return
    assert executed, run.stdout[-2000:]
    assert ("amx" in executed[-1]) == ("(AMX)" in label), (label, executed[-1])


def test_the_start_log_line_names_everything(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tokenedge.backend"):
        log_runtime(describe_runtime("cpu", torch.bfloat16, "sdpa"))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "tokenedge.backend"]
    for part in (
        "device=cpu",
        "dtype=bfloat16",
        f"threads={torch.get_num_threads()}",
        # the matmul path this CPU takes: oneDNN where it has bf16 support, ATen's fallback elsewhere (an AVX2 EPYC)
        "matmul=oneDNN" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "matmul=ATen bfloat16 fallback",
        "attention=sdpa",
        "sdpa_kernels=",
        "onednn_bf16=",
    ):
        assert part in line, line
