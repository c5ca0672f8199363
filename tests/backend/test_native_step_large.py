"""The native decoder step against the eager layers on a real model's shape, not only the tiny one
(tests/backend/test_native_step.py): two layers of Llama-3.2-1B's shape (2048 hidden, 8192 FFN, 32 query heads
over 8 KV heads, head_dim 64) and, for the math, of SmolLM2-1.7B's (the same widths, 32 KV heads: one query head per
KV head in the attention's head groups), where the kernels' cache blocking and row tiling run at the sizes served
models have. Random Q4_0 blocks (the dequantized weights load the same model, so eager and native multiply the same
numbers); the same math within bf16 rounding, and a decode's row equal in bits to the prefill's."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from backend.loader.quantized import Int4Blocks, int4_blocks
from backend.model.config import LlamaConfig
from backend.model.llama import LlamaModel, _causal_attention
from backend.model.native_step import PagedStep, sequence_step
from backend.model.quant import quantize_model
from harness.models.random_gguf import SHAPES
from harness.models.tiny import tiny_config, tiny_weights
from tests.backend.test_native_step import BLOCK, caches, dataclass_ctx, native, needs_kernel

Q4_0 = gguf.GGMLQuantizationType.Q4_0


def two_layers_of(shape_name: str) -> LlamaConfig:
    """Two layers of a published shape (`harness.models.random_gguf.SHAPES`), the tiny model's vocabulary."""
    shape = SHAPES[shape_name]
    return dataclasses.replace(
        tiny_config(),
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_layers=2,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        rope_theta=shape.rope_theta,
    )


CONFIG = two_layers_of("llama-3.2-1b")


def random_q4_0(rows: int, cols: int, rng: np.random.Generator) -> tuple[Int4Blocks, torch.Tensor]:
    """[rows, cols] as random Q4_0 blocks (std about 1/sqrt(cols)): (our blocks, gguf's dequantization)."""
    raw = rng.integers(0, 256, size=(rows, cols // 32, 18), dtype=np.uint8)  # fp16 scale + 16 nibble bytes
    raw[:, :, 0:2] = np.frombuffer(np.float16(1 / (4.6 * np.sqrt(cols))).tobytes(), dtype=np.uint8)
    raw = raw.reshape(rows, -1)
    blocks = int4_blocks(raw, Q4_0, (rows, cols))
    assert blocks is not None
    return blocks, torch.from_numpy(gguf.quants.dequantize(raw, Q4_0)).reshape(rows, cols)


def large_model(config: LlamaConfig = CONFIG) -> LlamaModel:
    torch.set_num_threads(1)
    weights = tiny_weights(config)  # norms and the embedding (vocab 256) as the tiny model has them
    rng = np.random.default_rng(0)
    blocks = {}
    for name, w in weights.items():
        if w.dim() == 2 and "embed" not in name:
            blocks[name], weights[name] = random_q4_0(*w.shape, rng)
    model = LlamaModel(config, dtype=torch.bfloat16)
    model.load_weights(weights)
    quantize_model(model, weights, blocks)
    return model


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@needs_kernel
@pytest.mark.parametrize("shape", ["llama-3.2-1b", "smollm2-1.7b"])
def test_the_native_step_computes_the_eager_layers_math_at_a_real_shape(shape: str) -> None:
    model = large_model(two_layers_of(shape))
    assert model.native_stack() is not None
    prompt = ids(37, seed=5)
    k, v = caches(model, blocks=8)
    got = native(model, prompt, list(range(37)), sequence_step(37, BLOCK, k, v))
    assert k[1][2, 4].abs().sum() > 0  # the native step ran: it wrote token 36's keys into the pool
    eager = model(torch.tensor(prompt), torch.arange(37), lambda _l, q, k, v: _causal_attention(q, k, v))
    rel = ((got - eager).norm(dim=1) / eager.norm(dim=1)).max().item()
    assert rel < 2e-2, f"largest relative row difference {rel}"


@needs_kernel
def test_a_decode_gives_the_bits_of_the_same_token_in_a_prefill_at_a_real_shape() -> None:
    model = large_model()
    prompt = ids(20, seed=6)
    whole = native(model, prompt, list(range(20)), sequence_step(20, BLOCK, *caches(model, blocks=8)))
    k, v = caches(model, blocks=8)
    native(model, prompt[:19], list(range(19)), sequence_step(19, BLOCK, k, v))
    decode = dataclass_ctx(slots=[19], tables=[[0, 1]], lens=[20], query_lens=[1])
    last = native(model, prompt[19:], [19], PagedStep(decode, k, v))
    assert torch.equal(last, whole[19:])
