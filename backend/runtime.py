"""What the backend computes with, found once at start: device, dtype, threads, and the matmul and attention
kernels torch will pick on this machine.

The same configuration runs different kernels on different CPUs: bf16 weights go through oneDNN with AMX tiles
on Sapphire Rapids and later, through AVX512-BF16 on Cooper Lake / Zen 4, and through a slower bf16 path
elsewhere; the fp32 logits go through MKL (or OpenBLAS). Speed (and, before issue 14's invariant kernels, the last
bits of the logits) differ accordingly, so the backend logs this at start and `/v1/models` reports it under
`tokenedge.runtime`. Everything here is read from torch's own capability queries, never assumed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("tokenedge.backend")

_SDPA_KERNELS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def describe_runtime(device: str, dtype: torch.dtype, attention: str) -> dict[str, Any]:
    """A JSON-ready description; `attention` is the resolved backend name (`sdpa` or `flash`)."""
    dev = torch.device(device)
    info: dict[str, Any] = {
        "device": str(dev),
        "device_name": _device_name(dev),
        "dtype": str(dtype).removeprefix("torch."),
        "logits_dtype": "float32",
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "matmul": _matmul_kernel(dev, dtype),
        "attention": attention,
    }
    if dev.type == "cpu":
        info["cpu"] = _cpu_features()
    if attention == "sdpa":
        info["sdpa_kernels"] = _sdpa_kernels(dev, dtype)
    elif attention == "flash":
        import flash_attn  # only resolved to "flash" when it imports (backend/attention/selector.py)

        info["flash_attn"] = getattr(flash_attn, "__version__", "unknown")
    return info


def log_runtime(info: dict[str, Any]) -> None:
    cpu = info.get("cpu", {})
    isa = ", ".join(
        name for name in ("amx_tile", "avx512_bf16", "amx_fp16", "avx512", "avx2") if cpu.get(name)
    )
    log.info(
        "runtime: device=%s (%s) dtype=%s threads=%d matmul=%s attention=%s%s%s",
        info["device"],
        info["device_name"],
        info["dtype"],
        info["threads"],
        info["matmul"],
        info["attention"],
        f" sdpa_kernels={info['sdpa_kernels']}" if "sdpa_kernels" in info else "",
        f" cpu=[{cpu.get('capability')}: {isa}; onednn_bf16={cpu.get('onednn_bf16')}]" if cpu else "",
    )


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel reports them (`/proc/cpuinfo`; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`; 'unknown CPU' where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU"
    return next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("model name")), "unknown CPU")


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model()


def _cpu_features() -> dict[str, Any]:
    cpu = torch.cpu
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),  # the ATen kernels' ISA: AVX512, AVX2, DEFAULT
        "avx2": cpu._is_avx2_supported(),
        "avx512": cpu._is_avx512_supported(),
        "avx512_bf16": cpu._is_avx512_bf16_supported(),
        "amx_tile": cpu._is_amx_tile_supported(),
        "amx_fp16": cpu._is_amx_fp16_supported(),
        "onednn": torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled),
        "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "mkl": torch.backends.mkl.is_available(),
    }


def _matmul_kernel(dev: torch.device, dtype: torch.dtype) -> str:
    """The GEMM behind the weight matmuls: torch routes CPU bf16/fp16 linears to oneDNN when it reports
    support (oneDNN then picks AMX or AVX512-BF16 itself), fp32 to the BLAS it was built with."""
    name = str(dtype).removeprefix("torch.")
    if dev.type == "cuda":
        return f"cuBLAS {name}"
    blas = "MKL" if torch.backends.mkl.is_available() else "BLAS"
    if dtype == torch.float32:
        return f"{blas} sgemm fp32"
    onednn = torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)
    supported = (
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
        if dtype == torch.bfloat16
        else torch.ops.mkldnn._is_mkldnn_fp16_supported()
    )
    if not (onednn and supported):
        return f"ATen {name} fallback (no oneDNN {name} support on this CPU)"
    if torch.cpu._is_amx_tile_supported() and (dtype == torch.bfloat16 or torch.cpu._is_amx_fp16_supported()):
        return f"oneDNN {name} (AMX)"
    if dtype == torch.bfloat16 and torch.cpu._is_avx512_bf16_supported():
        return f"oneDNN {name} (AVX512-BF16)"
    return f"oneDNN {name} (AVX512/AVX2, no AMX)"


def _sdpa_kernels(dev: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """The kernel torch's F.scaled_dot_product_attention dispatcher picks for the calls SdpaBackend makes (backend/attention/sdpa.py):
    prefill as [KH, G*n, D] against [KH, L, D] with a bool mask, decode as [B, KH, G, D] against [B, KH, L, D]."""
    kv_heads, group, head_dim, n, length = 2, 2, 64, 8, 24

    def choice(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> str:
        try:
            picked = int(torch._fused_sdp_choice(q, k, k, mask, 0.0, False))
        except (RuntimeError, AttributeError):
            return "unknown"
        return _SDPA_KERNELS.get(picked, f"backend {picked}")

    def rand(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=dev)

    prefill_mask = torch.ones(group * n, length, dtype=torch.bool, device=dev)
    decode_mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device=dev)
    kernels = {
        "prefill": choice(
            rand(kv_heads, group * n, head_dim), rand(kv_heads, length, head_dim), prefill_mask
        ),
        "decode": choice(
            rand(1, kv_heads, group, head_dim), rand(1, kv_heads, length, head_dim), decode_mask
        ),
    }
    if dev.type == "cuda" and dtype in (
        torch.float16,
        torch.bfloat16,
    ):  # SdpaBackend(cuda_flash_prefill=True)
        kernels["prefill"] = "flash/efficient (torch, causal or lower-right bias)"
    return kernels
