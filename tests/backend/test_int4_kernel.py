"""The int4 kernel (backend/kernels): close to the dequantized weights (bf16 output, inputs held to ~15 bits),
rows that never depend on their batch (count, position, the VNNI and AMX paths, threads), the packing, the
choice between it and torch's kernel, the served revision that tells the two apart, and the AMX tile
configuration as the CPU holds it (GCC 12's intrinsic trap, docs/design.md §8). Runs where the library builds for
the CPU: AVX512-VNNI and AVX512-BF16 (the AVX512 build, whose VNNI paths then serve every row count), or AVX2, FMA
and F16C (the AVX2 build, its AVX2 paths at every row count); the tile tests where the CPU also has AMX;
elsewhere the kernel is never chosen, which the choice tests check through the CPU flags."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest
import torch

from backend.__main__ import numerics
from backend.config import BackendConfig
from backend.kernels import build, load
from backend.kernels.load import KernelUnavailable, int4_kernel
from backend.kernels.ops import int4_mm, pack_int4, pack_vnni
from backend.loader.quantized import Int4Blocks
from backend.loader.revision import served_revision
from backend.model.quant import Int4Linear

needs_amx = pytest.mark.skipif(
    load.amx_unavailable() is not None,
    reason="needs tokenedge's kernel library (AVX512-VNNI/BF16 or AVX2/FMA/F16C) built and loaded",
)
needs_tiles = pytest.mark.skipif(
    load.amx_unavailable() is not None or not load.has_amx(), reason="needs AMX tiles"
)
# SmolLM2-135M's projections (N, K): fused QKV, o_proj, fused gate/up, down_proj
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def blocks(n: int, k: int, seed: int = 0) -> Int4Blocks:
    """Random Q4_1 blocks: fp16 d and m, as a GGUF file holds them (scale d, zero m + 8d)."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, generator=gen) * 0.02).half().float()
    m = ((torch.rand(n, k // 32, generator=gen) - 0.5) * 0.1).half().float()
    return Int4Blocks(
        codes=torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8), scales=d, zeros=m + 8 * d
    )


def q4_0_blocks(n: int, k: int, seed: int = 0) -> Int4Blocks:
    """Random Q4_0 blocks: fp16 d and no zero (w = d * (q - 8))."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, generator=gen) * 0.02).half().float()
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    return Int4Blocks(codes=codes, scales=d, zeros=torch.zeros_like(d))


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
    # one bf16 rounding of the result (2^-8 relative), plus the inputs' quantization (2^-15 of each group's
    # largest) and fp32 folds, on the scale of the row's absolute products
    bound = exact.abs() * 2.0**-8 + 1e-4 * (x.double().abs() @ b.dequantize().double().abs().t())
    assert torch.all((got - exact).abs() <= bound)


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 12])
def test_codes_and_inputs_enter_the_product_exactly(rows: int) -> None:
    """Inputs the two-pass quantization holds exactly (each group's largest is 127, whose code means w = 0),
    codes of w = code - 8 (scale 1, zero 0): every output is the exact integer, on either path."""
    n, k = 32, 64
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(6, 11, (n, k), generator=gen, dtype=torch.uint8)  # w in -2..2
    codes[:, ::32] = 8  # w = 0 where each group's 127 sits
    b = Int4Blocks(codes=codes, scales=torch.ones(n, k // 32), zeros=torch.zeros(n, k // 32))
    x = torch.randint(-1, 2, (rows, k), generator=gen).float()
    x[:, ::32] = 127.0
    exact = x.double() @ (codes.double() - 8).t()  # |y| <= 124: bf16 holds it exactly
    assert torch.equal(int4_mm(x.to(torch.bfloat16), *pack_int4(b.codes, b.scales, b.zeros)).double(), exact)


@needs_amx
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("case", ["random", "largest", "smallest"])
def test_the_integer_sums_are_exact_at_their_limits(rows: int, case: str) -> None:
    """Inputs that quantize exactly (integers, each group's largest |x| 127: s1 = 1, a2 = 0) against codes of
    scale 1, zero 0 (zp = -8): every fp32 step of the fold is then exact, so each output is the exact int64 sum
    rounded once to bf16. 'largest' and 'smallest' put every code at 15 and every input at +127 or -127, the
    AVX2 build's int16 partial sums at their bound (16 * 15 * 127 = 30480 < 32767)."""
    n, k = 48, 256
    gen = torch.Generator().manual_seed(11)
    if case == "random":
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        x = torch.randint(-127, 128, (rows, k), generator=gen)
        x[:, ::32] = 127 * torch.where(torch.rand(rows, k // 32, generator=gen) < 0.5, -1, 1)
    else:
        codes = torch.full((n, k), 15, dtype=torch.uint8)
        codes[1::2, 64:] = torch.randint(0, 16, (n // 2, k - 64), generator=gen, dtype=torch.uint8)
        x = torch.full((rows, k), 127 if case == "largest" else -127)
    b = Int4Blocks(codes=codes, scales=torch.ones(n, k // 32), zeros=torch.zeros(n, k // 32))
    exact = x.long() @ (codes.long() - 8).t()  # int64
    assert exact.abs().max() < 2**24  # and the fold's partial sums too: all exact in fp32
    got = int4_mm(x.to(torch.bfloat16), *pack_int4(b.codes, b.scales, b.zeros))
    assert torch.equal(got, exact.double().to(torch.bfloat16))


@needs_amx
def test_the_heads_integer_sums_are_exact() -> None:
    """int8_vnni with unit scales: sum over both passes of (u - 128) * code, exactly, at the extremes (q = +-127
    against codes +-127: the AVX2 build's vpmaddubsw pairs at their bound, 2 * 127 * 127 = 32258 < 32767)."""
    gen = torch.Generator().manual_seed(12)
    n, k = 64, 128
    codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    codes[:16] = 127
    codes[16:32] = -127
    q = torch.randint(-127, 128, (3, 2, k), generator=gen)
    q[0] = 127
    q[1, 0] = -127
    u = (q + 128).to(torch.uint8)
    colsum = codes.sum(dim=1, dtype=torch.int32)
    got = torch.ops.tokenedge.int8_vnni(u, torch.ones(3, 2), pack_vnni(codes), colsum, torch.ones(n))
    exact = q.sum(dim=1).long() @ codes.long().t()  # [3, N]: both passes at scale 1
    assert torch.equal(got.double(), exact.double())


@needs_amx
def test_the_ops_that_need_tiles_refuse_without_them() -> None:
    """Where the library has no AMX paths (the AVX2 build, or a CPU without AMX) int8_mm and the tile debug op
    stay registered and refuse with a reason; int8_vnni and int4_mm serve every row count."""
    if load.has_amx():
        pytest.skip("this CPU runs the AMX paths")
    with pytest.raises(RuntimeError, match="AMX"):
        torch.ops.tokenedge.int8_mm(
            activations(2, 64), torch.zeros(2, 2, 512, dtype=torch.int8), torch.ones(32)
        )
    with pytest.raises(RuntimeError, match="AMX"):
        torch.ops.tokenedge.tile_config_roundtrip(16, 32, 8)


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
def test_a_q4_0_weight_streams_its_scales_alone_for_the_same_bits() -> None:
    """Q4_0 (every zero 0) packs one factor plane, the scales: the fold computes each zero point as -8 * scale,
    the value a second plane would hold, so every row count (VNNI; AMX from 4 rows where the CPU has it) gives
    the two-plane packing's bits, from 10% fewer bytes. Q4_1 keeps both planes."""
    b = q4_0_blocks(96, 576)
    codes, one = pack_int4(b.codes, b.scales, b.zeros)
    q4_1 = blocks(96, 576)
    assert one.shape == (6, 18, 1, 16)
    assert pack_int4(q4_1.codes, q4_1.scales, q4_1.zeros)[1].shape == (6, 18, 2, 16)
    two = torch.stack([one[:, :, 0], (one[:, :, 0].float() * -8).half()], dim=2).contiguous()
    assert (codes.numel() + 2 * one.numel()) * 10 == (codes.numel() + 2 * two.numel()) * 9
    x = activations(20, 576)
    exact = x.double() @ b.dequantize().double().t()
    for m in (1, 2, 3, 4, 8, 9, 20):
        got = int4_mm(x[:m], codes, one)
        assert torch.equal(got, int4_mm(x[:m], codes, two)), m
        torch.testing.assert_close(got.double(), exact[:m], rtol=2**-7, atol=1e-3)
    # the mutation: a zero point one scale off (-7 * scale) changes the bits this test compares
    off = torch.stack([one[:, :, 0], (one[:, :, 0].float() * -7).half()], dim=2).contiguous()
    assert not torch.equal(int4_mm(x, codes, one), int4_mm(x, codes, off))


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
    assert hasattr(amx, "factors") and amx.packed.dim() == 4 and reference.packed.dim() != 4  # two layouts


@needs_amx
def test_bad_inputs_are_refused_with_a_reason() -> None:
    b = blocks(32, 64)
    codes, factors = pack_int4(b.codes, b.scales, b.zeros)
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.tokenedge.int4_mm(activations(2, 96), codes, factors)
    with pytest.raises(RuntimeError, match="bf16"):
        torch.ops.tokenedge.int4_mm(activations(2, 64).float(), codes, factors)
    with pytest.raises(RuntimeError, match="factors"):
        torch.ops.tokenedge.int4_mm(activations(2, 64), codes, factors.float())
    with pytest.raises(RuntimeError, match="factors"):  # three planes
        torch.ops.tokenedge.int4_mm(activations(2, 64), codes, torch.cat([factors, factors[:, :, :1]], 2))
    assert int4_mm(activations(0, 64), codes, factors).shape == (0, 32)


def test_no_tile_configuration_goes_through_gccs_intrinsics() -> None:
    """GCC 12's _tile_loadconfig and _tile_storeconfig name an 8-byte operand: the compiler may drop the
    stores that fill the rest of the 64-byte configuration, and ldtilecfg then faults (docs/design.md §8). The
    kernel names the whole struct in its own asm instead."""
    source = build.SOURCE.read_text()
    assert not re.search(r"\b_tile_(load|store)config\s*\(", source)
    assert re.search(r'"ldtilecfg %0"\s*::\s*"m"\(cfg\)', source)


def test_tile_loads_and_stores_go_through_the_ordered_macros() -> None:
    """GCC 12's _tile_loadd and _tile_stored tell the compiler of no memory access; the kernel calls each once,
    inside a macro that puts a compiler barrier on its memory side, and everywhere else that macro."""
    source = build.SOURCE.read_text()
    assert (
        len(re.findall(r"\b_tile_loadd\(", source)) == 1 and len(re.findall(r"\b_tile_stored\(", source)) == 1
    )
    for macro, raw in (("TE_TILE_LOAD", "_tile_loadd"), ("TE_TILE_STORE", "_tile_stored")):
        body = source[source.index(f"#define {macro}(") :].split("while (0)")[0]
        assert f"{raw}(" in body and '__asm__ volatile("" ::: "memory")' in body
        assert len(re.findall(rf"\b{macro}\(", source)) > 2  # defined, and used


def tile_config(rows: int, a_bytes: int, b_rows: int) -> bytes:
    """The 64 bytes `configure` (int4_amx.cpp) means: palette 1, C tiles 0-1 and A tiles 2-3 of `rows`
    rows (64 and `a_bytes` bytes a row), B tiles 4-5 of `b_rows` rows of 64 bytes, tiles 6-15 unused."""
    colsb = [64, 64, a_bytes, a_bytes, 64, 64] + [0] * 10
    heights = [rows] * 4 + [b_rows] * 2 + [0] * 10
    return bytes([1, 0] + [0] * 14) + b"".join(c.to_bytes(2, "little") for c in colsb) + bytes(heights)


@needs_tiles
@pytest.mark.parametrize(
    ("rows", "a_bytes", "b_rows"),
    [(16, 32, 8), (2, 32, 8), (10, 32, 8), (16, 64, 16), (3, 64, 16)],  # int4_mm's, then int8_mm's
)
def test_the_tile_configuration_reaches_the_cpu_whole(rows: int, a_bytes: int, b_rows: int) -> None:
    """What ldtilecfg loaded, read back with sttilecfg: every byte the kernel filled (a dropped store shows
    as a stale byte, or as a fault)."""
    held = torch.ops.tokenedge.tile_config_roundtrip(rows, a_bytes, b_rows)
    assert held.dtype == torch.uint8 and bytes(held.tolist()) == tile_config(rows, a_bytes, b_rows)


@needs_tiles
def test_the_self_check_refuses_a_configuration_that_reads_back_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel is only used once the CPU holds the configuration `configure` means (else torch's kernel)."""
    load._self_check()
    monkeypatch.setattr(load, "_tile_config", lambda rows, a_bytes, b_rows: tile_config(rows, a_bytes, 1))
    with pytest.raises(RuntimeError, match="tile configuration"):
        load._self_check()


def test_the_packing_holds_every_code_once() -> None:
    b = blocks(32, 64)
    codes, factors = pack_int4(b.codes, b.scales, b.zeros)
    assert codes.shape == (2, 2, 8, 32) and factors.shape == (2, 2, 2, 16)
    # column 17 (block 1, lane 1), group 1, quad 3: k = 32 + 12 .. 15 in bytes 2 and 3 of the quad
    quad = codes[1, 1, 3]
    assert [int(quad[2] & 15), int(quad[2] >> 4), int(quad[3] & 15), int(quad[3] >> 4)] == b.codes[
        17, 44:48
    ].tolist()
    nibbles = torch.stack([codes & 15, codes >> 4], dim=-1)
    assert sorted(nibbles.flatten().tolist()) == sorted(b.codes.flatten().tolist())
    # column 17, group 1: its scale and zero - 8 * scale (Q4_1's d and m), exactly, in fp16
    assert factors.dtype == torch.float16
    assert factors[1, 1, 0, 1].float() == b.scales[17, 1]
    assert factors[1, 1, 1, 1].float() == b.zeros[17, 1] - 8 * b.scales[17, 1]


def test_the_choice_follows_the_environment(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(load.ENV, "torch")
    assert int4_kernel() == "torch"
    int4_kernel.cache_clear()
    fresh_choice.setenv(load.ENV, "fastest")
    with pytest.raises(ValueError, match="auto, amx, torch"):
        int4_kernel()


def test_a_cpu_without_amx_keeps_torchs_kernel(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setattr(load, "amx_unavailable", lambda: "this CPU lacks amx_bf16")
    fresh_choice.setenv(load.ENV, "auto")
    assert int4_kernel() == "torch"
    int4_kernel.cache_clear()
    fresh_choice.setenv(load.ENV, "amx")
    with pytest.raises(KernelUnavailable, match="lacks amx_bf16"):
        int4_kernel()


@needs_amx
def test_a_build_is_reused(tmp_path_factory: pytest.TempPathFactory) -> None:
    first = build.build()
    stamp = first.stat().st_mtime_ns
    assert build.build() == first and first.stat().st_mtime_ns == stamp


@needs_amx
def test_the_amx_kernels_id_follows_its_source_and_names_its_build(fresh_choice: pytest.MonkeyPatch) -> None:
    """'amx.<hash>' for the AVX512 build (as before the AVX2 build existed), 'avx2.<hash>' for the AVX2 build:
    their fp32 bits may differ, so a model served on one is another revision than on the other."""
    fresh_choice.setenv(load.ENV, "auto")
    ident = load.kernel_id()
    digest = hashlib.blake2b(
        b"".join(s.read_bytes() for s in (*build.SOURCES, *build.HEADERS)), digest_size=4
    )
    assert ident == f"{'amx' if load.isa() == 'avx512' else 'avx2'}.{digest.hexdigest()}"


def test_the_build_follows_the_cpus_flags() -> None:
    avx512 = {"avx512_bf16", "avx512_vnni", "avx512bw", "avx512vl", "f16c", "avx2", "fma", "bmi2"}
    assert build.isa(avx512) == "avx512" and build.isa(avx512 | {"amx_tile"}) == "avx512"
    assert build.isa({"avx2", "fma", "f16c", "bmi2", "avx512f"}) == "avx2"  # AVX512F alone: no VNNI, no BF16
    assert build.isa({"avx2", "fma", "bmi2"}) is None and build.isa(set()) is None
    assert "-mamx-tile" in build.ISAS["avx512"][1] and not any("512" in f for f in build.ISAS["avx2"][1])


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(build.ISAS))
def test_each_build_compiles_on_any_x86_machine(target: str) -> None:
    """Both builds from the one source (only one of them runs here): a change for one ISA cannot break the
    other's build unseen."""
    assert build.build(target).exists()


def test_the_served_revision_tells_kernels_and_modes_apart(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(load.ENV, "torch")
    quantized_torch = numerics(BackendConfig(), "cpu")
    assert quantized_torch == "cpu bfloat16 quantized int4-torch"
    reference = numerics(BackendConfig(weights="dequantized"), "cpu")
    assert numerics(BackendConfig(), "cuda") == "cuda bfloat16 dequantized"
    kinds = {quantized_torch, "cpu bfloat16 quantized int4-amx.0123abcd", reference}
    revisions = {served_revision("rev-0123", kind) for kind in kinds}
    assert len(revisions) == 3 and all(r.startswith("rev-") for r in revisions)
    assert served_revision("rev-0123", reference) == served_revision("rev-0123", reference)
