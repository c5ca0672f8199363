"""Quantized weights: GGUF 4-bit blocks unpacked exactly, the int4/int8 kernels row-invariant on every layer
shape, the quantized LM head greedy-exact, and a quantized engine batch-invariant."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.loader.quantized import Int4Blocks, int4_blocks
from backend.model import head as head_module
from backend.model.head import RescoredHead
from backend.model.quant import Int4Linear, Int8Linear, quantize_model
from harness.models.tiny import tiny_config, tiny_model, tiny_weights
from tests.backend.test_int4_kernel import needs_amx

Q4 = [gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1]
# (N, K) of SmolLM2-135M's fused layers (qkv, o, gate_up, down) and of the tiny test model
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (128, 64), (64, 64), (256, 64), (64, 128)]


def gguf_blocks(weight: torch.Tensor, kind: gguf.GGMLQuantizationType) -> tuple[Int4Blocks, torch.Tensor]:
    """Quantize with the gguf package itself: (our unpacked blocks, gguf's own dequantization)."""
    raw = gguf.quants.quantize(weight.numpy(), kind)
    blocks = int4_blocks(raw, kind, tuple(weight.shape))
    assert blocks is not None
    return blocks, torch.from_numpy(gguf.quants.dequantize(raw, kind)).reshape(weight.shape)


@pytest.mark.parametrize("kind", Q4)
def test_4bit_blocks_dequantize_exactly_like_gguf(kind: gguf.GGMLQuantizationType) -> None:
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(1))
    blocks, expected = gguf_blocks(weight, kind)
    assert torch.equal(blocks.dequantize(), expected)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(2))
    assert torch.equal(blocks.rows(order).dequantize(), expected[order])


def test_q8_0_is_not_kept_as_4bit_blocks() -> None:
    raw = gguf.quants.quantize(np.ones((4, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    assert int4_blocks(raw, gguf.GGMLQuantizationType.Q8_0, (4, 32)) is None


@pytest.mark.parametrize("kind", Q4)
def test_int4_kernel_computes_the_dequantized_matmul(kind: gguf.GGMLQuantizationType) -> None:
    gen = torch.Generator().manual_seed(3)
    blocks, dense = gguf_blocks(torch.randn(576, 1536, generator=gen), kind)
    x = torch.randn(5, 1536, generator=gen)
    expected = x @ dense.t()
    got = Int4Linear(blocks)(x).float()
    # bf16 activations and bf16 (scale, zero): about bf16 weights' own error (design §8)
    assert ((got - expected).norm() / expected.norm()).item() < 6e-3


def test_int8_linear_is_close_to_the_dense_matmul() -> None:
    gen = torch.Generator().manual_seed(4)
    weight, x = torch.randn(320, 576, generator=gen), torch.randn(3, 576, generator=gen)
    expected = x @ weight.t()
    got = Int8Linear(weight)(x).float()
    assert ((got - expected).norm() / expected.norm()).item() < 1e-2


def _assert_rows_invariant(layer: torch.nn.Module, k: int, max_m: int = 64) -> None:
    x = torch.randn(max_m, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    single = torch.cat([layer(x[i : i + 1]) for i in range(max_m)])  # [max_m, N], each row alone
    for m in range(2, max_m + 1):
        assert torch.equal(layer(x[:m]), single[:m]), f"rows change when M={m}"


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int4_kernel_rows_do_not_depend_on_the_batch(n: int, k: int) -> None:
    blocks, _ = gguf_blocks(torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)), Q4[1])
    _assert_rows_invariant(Int4Linear(blocks), k)


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int8_kernel_rows_do_not_depend_on_the_batch(n: int, k: int) -> None:
    _assert_rows_invariant(Int8Linear(torch.randn(n, k, generator=torch.Generator().manual_seed(n))), k)


def test_quantized_layers_decode_one_row_without_padding() -> None:
    blocks, _ = gguf_blocks(torch.randn(128, 64, generator=torch.Generator().manual_seed(3)), Q4[1])
    for layer in (Int4Linear(blocks), Int8Linear(torch.randn(128, 64))):
        layer.calibrate({})
        assert layer.tiling is not None and layer.tiling.min_rows == 1, layer.tiling


@pytest.mark.parametrize(
    ("amx", "dense_rows"),
    [
        (False, 10**9),
        (False, 1),
        pytest.param(True, 10**9, marks=needs_amx),
    ],
    ids=["int8", "bf16", "amx-int8"],
)
def test_quantized_head_picks_the_fp32_heads_token_even_near_ties(
    amx: bool, dense_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_module, "DENSE_ROWS", dense_rows)  # which approximation picks the candidates
    gen = torch.Generator().manual_seed(6)
    weight = torch.randn(4096, 64, generator=gen) * 0.3  # [V, H]
    # near-ties: pairs of tokens whose rows differ by far less than int8's or bf16's rounding
    weight[1::2] = weight[0::2] + torch.randn(2048, 64, generator=gen) * 1e-4
    head = RescoredHead(weight, amx)
    hidden = torch.randn(256, 64, generator=gen) * 3  # [N, H]
    exact = F.linear(hidden.double(), weight.double())
    assert torch.equal(head.greedy_logits(hidden).argmax(dim=1), exact.argmax(dim=1))
    # and the approximation alone would have got some of them wrong
    approx, _ = head.approximate(hidden)
    assert not torch.equal(approx.argmax(dim=1), exact.argmax(dim=1))


@needs_amx
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
def test_the_amx_heads_approximations_hold_their_bound(rows: int) -> None:
    """VNNI (1-3 rows, and every row count without AMX: the AVX2 build) and AMX int8 (4+): the same w_hat as
    torch's int8 kernel; every approximate logit within its bound of the exact one, by a margin (the bound is
    doubled), with hidden states of several scales."""
    gen = torch.Generator().manual_seed(8)
    head = RescoredHead(torch.randn(1024, 96, generator=gen) * 0.3, amx=True)
    hidden = torch.randn(rows, 96, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
    approx, bound = head.approximate(hidden)
    exact = hidden.double() @ head.exact.double().t()
    assert torch.all((approx.double() - exact).abs() <= bound.double() / 2)
    # and close to w_hat . h itself, on the Cauchy-Schwarz scale ||h|| ||w_hat||: VNNI's two int8 passes hold
    # about 16 bits of h, the AMX kernel takes h in bf16 (8 bits)
    w_hat = head.codes.double() * head.scales.double()[:, None]
    scale = hidden.double().norm(dim=1, keepdim=True) * w_hat.norm(dim=1)
    tolerance = 1e-4 if rows < head_module.AMX_ROWS or head.amx is None else 2.0**-8
    assert torch.all((approx.double() - hidden.double() @ w_hat.t()).abs() <= tolerance * scale)


def _quantized_tiny(with_blocks: bool) -> torch.nn.Module:
    model = tiny_model(dtype=torch.bfloat16)
    weights = tiny_weights(tiny_config())
    blocks = {}
    if with_blocks:
        for name, w in weights.items():
            if w.dim() == 2 and "embed" not in name:
                blocks[name], weights[name] = gguf_blocks(w, Q4[1])
        model.load_weights(weights)
    quantize_model(model, weights, blocks)
    return model


@pytest.mark.parametrize("with_blocks", [True, False], ids=["int4", "int8"])
def test_quantized_greedy_output_is_batch_invariant(with_blocks: bool) -> None:
    model = _quantized_tiny(with_blocks)
    kind = Int4Linear if with_blocks else Int8Linear
    assert isinstance(model.layers[0].self_attn.qkv_proj, kind)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[(7 * i + j) % 250 + 1 for j in range(5 + 3 * i)] for i in range(6)]
    config = EngineConfig(
        speculative_tokens=0, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=16, max_model_len=128
    )
    together = LLMEngine(model, config, frozenset()).generate(prompts, params)
    alone = [LLMEngine(model, config, frozenset()).generate([p], params)[0] for p in prompts]
    assert together == alone


def test_quantized_weights_need_a_cpu_model() -> None:
    model = tiny_model()
    model.device = torch.device("meta")
    with pytest.raises(ValueError, match="CPU"):
        quantize_model(model, tiny_weights(tiny_config()), {})
