"""The native step's attention (backend/kernels/attend.h): 8 keys' scores reduced at once give each key the bits of
its own reduction (a key's score must not depend on where it falls in a run of 8), and every head width the
kernel is instantiated for, every query-head group (sharing a K row's widening by up to 4 heads, a group of 5
split), keys walked across a shuffled block table: the eager layers' math within bf16 rounding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.kernels import load
from backend.model.llama import LlamaModel, _causal_attention
from backend.model.native_step import PagedStep
from backend.model.quant import quantize_model
from harness.models.tiny import tiny_config, tiny_weights
from tests.backend.test_native_step import BLOCK, caches, dataclass_ctx, native, rand_ids
from tests.backend.test_quant import Q4, gguf_blocks

needs_kernel = pytest.mark.skipif(
    load.amx_unavailable() is not None, reason="needs tokenedge's kernel library built and loaded"
)


def tree_sum(row: np.ndarray) -> np.float32:
    """reduce_add's tree in fp32 (simd.h, both builds): lane i + i+8, then i + i+4, i + i+2, i + i+1."""
    w = row[:8] + row[8:]
    s = w[:4] + w[4:]
    return np.float32((s[0] + s[2]) + (s[1] + s[3]))


# values of mixed magnitudes, where a different order of additions gives different bits
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 6).flatmap(
        lambda n: st.lists(st.lists(finite, min_size=16, max_size=16), min_size=8 * n, max_size=8 * n)
    ),
    scale=st.sampled_from([1.0, 0.125, 1 / np.sqrt(48)]),
)
def test_eight_keys_reduced_at_once_give_each_key_its_own_bits(rows: list[list[float]], scale: float) -> None:
    x = torch.tensor(rows, dtype=torch.float32)
    one, eight = torch.ops.tokenedge.reduce_sums(x, scale)
    assert torch.equal(one.view(torch.int32), eight.view(torch.int32))
    want = np.array([tree_sum(r) * np.float32(scale) for r in x.numpy()], dtype=np.float32)
    assert np.array_equal(one.numpy().view(np.int32), want.view(np.int32))


def int4_model(heads: int, kv_heads: int, head_dim: int) -> LlamaModel:
    config = dataclasses.replace(tiny_config(), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    weights = tiny_weights(config)
    blocks = {}
    for name, w in weights.items():
        if w.dim() == 2 and "embed" not in name:
            blocks[name], weights[name] = gguf_blocks(w, Q4[1])
    model = LlamaModel(config, dtype=torch.bfloat16)
    model.load_weights(weights)
    quantize_model(model, weights, blocks)
    assert model.native_stack() is not None
    return model


@needs_kernel
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(5, 1, 32), (2, 2, 48), (4, 1, 128), (6, 2, 64)],
    ids=["group5-lanes2", "group1-lanes3", "group4-lanes8", "group3-lanes4"],
)
def test_every_head_width_and_group_attends_as_the_eager_layers(
    heads: int, kv_heads: int, head_dim: int
) -> None:
    """A 45-token prefill over blocks placed out of order (keys 0-15 in block 2, 16-31 in block 0, the rest in
    block 1): every token's attention over 1-45 keys, runs of 8 and a tail, within bf16 rounding."""
    model = int4_model(heads, kv_heads, head_dim)
    ids = rand_ids(45, seed=5)
    table = [2, 0, 1]
    slots = [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(45)]
    step = dataclass_ctx(slots=slots, tables=[table], lens=[45], query_lens=[45])
    got = native(model, ids, list(range(45)), PagedStep(step, *caches(model)))
    eager = model(torch.tensor(ids), torch.arange(45), lambda _l, q, k, v: _causal_attention(q, k, v))
    rel = ((got - eager).norm(dim=1) / eager.norm(dim=1)).max().item()
    assert rel < 2e-2, f"largest relative row difference {rel}"
