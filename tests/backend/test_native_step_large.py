"""The native decoder step's second oracle check (issue 36): at SmolLM2-1.7B's layer shape (hidden 2048, 32 heads of
64, FFN 8192), where the kernels' cache blocking and prefetch distance matter and the tiny model's checks cannot
reach, the native step's hidden states match the model's eager layers (the same int4 products) within bf16
rounding, and a decode row keeps the bits of the same token in a prefill. Two layers of random weights, Q4_1 as the
shipped file; a few seconds of quantization with the gguf package."""

from __future__ import annotations

import dataclasses

import torch

from backend.model.llama import LlamaModel, _causal_attention
from backend.model.native_step import PagedStep, sequence_step
from backend.model.quant import quantize_model
from harness.models.tiny import tiny_config, tiny_weights
from tests.backend.test_native_step import BLOCK, caches, dataclass_ctx, native, needs_kernel, rand_ids
from tests.backend.test_quant import Q4, gguf_blocks


def large_int4_model() -> LlamaModel:
    config = dataclasses.replace(
        tiny_config(), hidden_size=2048, intermediate_size=8192, num_heads=32, num_kv_heads=32, head_dim=64
    )
    weights = tiny_weights(config, seed=7)
    for name, w in weights.items():  # scaled for 2048 and 8192 inputs as the tiny model's are for 64 and 128
        if w.dim() == 2 and "embed" not in name:
            weights[name] = w * (64 / w.shape[1]) ** 0.5
    blocks = {}
    for name, w in weights.items():
        if w.dim() == 2 and "embed" not in name:
            blocks[name], weights[name] = gguf_blocks(w, Q4[1])
    model = LlamaModel(config, dtype=torch.bfloat16)
    model.load_weights(weights)
    quantize_model(model, weights, blocks)
    return model


@needs_kernel
def test_at_the_large_shape_the_native_step_computes_the_eager_layers_math() -> None:
    model = large_int4_model()
    assert model.native_stack() is not None
    ids = rand_ids(37, seed=4)
    k, v = caches(model)
    got = native(model, ids, list(range(37)), sequence_step(37, BLOCK, k, v))
    eager = model(torch.tensor(ids), torch.arange(37), lambda _l, q, k, v: _causal_attention(q, k, v))
    rel = ((got - eager).norm(dim=1) / eager.norm(dim=1)).max().item()
    assert rel < 2e-2, f"largest relative row difference {rel}"
    # the decode of token 37 from the cache: the bits of the same row in a 37-token prefill
    k2, v2 = caches(model)
    native(model, ids[:36], list(range(36)), sequence_step(36, BLOCK, k2, v2))
    decode = dataclass_ctx(slots=[36], tables=[[0, 1, 2]], lens=[37], query_lens=[1])
    last = native(model, ids[36:], [36], PagedStep(decode, k2, v2))
    assert torch.equal(last, got[36:])
