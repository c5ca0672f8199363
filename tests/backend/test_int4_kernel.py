"""The AMX int4 kernel (backend/kernels): exact against the dequantized weights up to its bf16 output, rows
that never depend on their batch (count, position, threads), the packing, the choice between it and torch's
kernel, and the served revision that tells the two apart. Runs where the CPU has AMX-BF16 (this project's
machines do); elsewhere the kernel is never chosen, which the choice tests check through the CPU flags."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from backend import kernels
from backend.__main__ import numerics
from backend.config import BackendConfig
from backend.kernels import KernelUnavailable, int4_kernel, int4_mm, pack_int4
from backend.loader.quantized import Int4Blocks
from backend.loader.revision import served_revision
from backend.model.quant import Int4Linear

needs_amx = pytest.mark.skipif(
    kernels.amx_unavailable() is not None, reason="needs AMX-BF16 and the built kernel"
)
# SmolLM2-135M's projections (N, K): fused QKV, o_proj, fused gate/up, down_proj
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def blocks(n: int, k: int, seed: int = 0) -> Int4Blocks:
    gen = torch.Generator().manual_seed(seed)
    return Int4Blocks(
        codes=torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
        scales=torch.rand(n, k // 32, generator=gen) * 0.02,
        zeros=(torch.rand(n, k // 32, generator=gen) - 0.5) * 0.1,
    )


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """`int4_kernel()` re-read from the environment, and the served choice restored afterwards."""
    int4_kernel.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    int4_kernel.cache_clear()


@needs_amx
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_matches_the_dequantized_weights_to_bf16_rounding(n: int, k: int) -> None:
    b = blocks(n, k)
    x = activations(40, k)
    exact = x.double() @ b.dequantize().double().t()  # [40, N]
    got = int4_mm(x, *pack_int4(b.codes, b.scales, b.zeros)).double()
    # one bf16 rounding of the fp32 result (2^-8 relative) plus fp32 accumulation, scaled by the row's size
    bound = exact.abs() * 2.0**-8 + 1e-5 * (x.double().abs() @ b.dequantize().double().abs().t())
    assert torch.all((got - exact).abs() <= bound)


@needs_amx
def test_codes_enter_the_product_exactly() -> None:
    """Integer activations and weights (scale 1, zero 0: w = code - 8): every output is the exact integer."""
    n, k = 32, 64
    gen = torch.Generator().manual_seed(3)
    b = Int4Blocks(
        codes=torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
        scales=torch.ones(n, k // 32),
        zeros=torch.zeros(n, k // 32),
    )
    x = torch.randint(-3, 4, (5, k), generator=gen).to(torch.bfloat16)
    exact = x.double() @ (b.codes.double() - 8).t()  # small integers: bf16 holds them exactly
    assert torch.equal(int4_mm(x, *pack_int4(b.codes, b.scales, b.zeros)).double(), exact)


@needs_amx
@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536)])
def test_a_row_never_depends_on_its_batch(n: int, k: int) -> None:
    """Every row of every call of 1..40 rows, at several offsets, is bitwise the row computed alone; and the
    same under one thread as under two (the column split changes)."""
    packed = pack_int4(*(lambda b: (b.codes, b.scales, b.zeros))(blocks(n, k)))
    x = activations(48, k)
    alone = torch.cat([int4_mm(x[i : i + 1], *packed) for i in range(48)])
    for m in [*range(1, 19), 31, 32, 33, 40]:
        for start in (0, 5, 48 - m):
            assert torch.equal(int4_mm(x[start : start + m], *packed), alone[start : start + m]), (m, start)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(int4_mm(x, *packed), alone)
    finally:
        torch.set_num_threads(threads)


@needs_amx
def test_int4_linear_on_either_kernel_computes_the_same_weight() -> None:
    b = blocks(64, 96)
    x = activations(7, 96).float()
    amx, reference = Int4Linear(b, "amx"), Int4Linear(b, "torch")
    assert amx.kernel == "amx" and reference.kernel == "torch"
    exact = x.double() @ b.dequantize().double().t()
    # torch's kernel rounds the scales and zeros to bf16 on top of the output's rounding: a looser bound
    for y, atol in ((amx(x), 1e-4), (reference(x), 5e-3)):
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.double(), exact, rtol=2**-7, atol=atol)
    assert amx.script_parts()[0] != reference.script_parts()[0]


@needs_amx
def test_bad_inputs_are_refused_with_a_reason() -> None:
    b = blocks(32, 64)
    codes, factors = pack_int4(b.codes, b.scales, b.zeros)
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.tokenedge.int4_mm(activations(2, 96), codes, factors)
    with pytest.raises(RuntimeError, match="bf16"):
        torch.ops.tokenedge.int4_mm(activations(2, 64).float(), codes, factors)
    with pytest.raises(RuntimeError, match="factors"):
        torch.ops.tokenedge.int4_mm(activations(2, 64), codes, factors.double())
    assert int4_mm(activations(0, 64), codes, factors).shape == (0, 32)


def test_the_packing_holds_every_code_once() -> None:
    b = blocks(32, 64)
    codes, factors = pack_int4(b.codes, b.scales, b.zeros)
    assert codes.shape == (2, 2, 256) and factors.shape == (2, 2, 2, 16)
    nibbles = torch.stack([codes & 15, codes >> 4], dim=-1)  # [block, g, byte, nibble]
    assert sorted(nibbles.flatten().tolist()) == sorted(b.codes.flatten().tolist())
    # column 17, group 1: its scale and the min of the (128 + code) form
    assert factors[1, 1, 0, 1] == b.scales[17, 1]
    assert factors[1, 1, 1, 1] == b.zeros[17, 1] - 136 * b.scales[17, 1]


def test_the_choice_follows_the_environment(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(kernels.ENV, "torch")
    assert int4_kernel() == "torch"
    int4_kernel.cache_clear()
    fresh_choice.setenv(kernels.ENV, "fastest")
    with pytest.raises(ValueError, match="auto, amx, torch"):
        int4_kernel()


def test_a_cpu_without_amx_keeps_torchs_kernel(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setattr(kernels, "amx_unavailable", lambda: "this CPU lacks amx_bf16")
    fresh_choice.setenv(kernels.ENV, "auto")
    assert int4_kernel() == "torch"
    int4_kernel.cache_clear()
    fresh_choice.setenv(kernels.ENV, "amx")
    with pytest.raises(KernelUnavailable, match="lacks amx_bf16"):
        int4_kernel()


@needs_amx
def test_a_build_is_reused(tmp_path_factory: pytest.TempPathFactory) -> None:
    first = kernels.build()
    stamp = first.stat().st_mtime_ns
    assert kernels.build() == first and first.stat().st_mtime_ns == stamp


def test_the_served_revision_tells_kernels_and_modes_apart(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(kernels.ENV, "torch")
    quantized_torch = numerics(BackendConfig(), "cpu")
    assert quantized_torch == "cpu bfloat16 quantized int4-torch"
    reference = numerics(BackendConfig(weights="dequantized"), "cpu")
    assert numerics(BackendConfig(), "cuda") == "cuda bfloat16 dequantized"
    kinds = {quantized_torch, "cpu bfloat16 quantized int4-amx", reference}
    revisions = {served_revision("rev-0123", kind) for kind in kinds}
    assert len(revisions) == 3 and all(r.startswith("rev-") for r in revisions)
    assert served_revision("rev-0123", reference) == served_revision("rev-0123", reference)
