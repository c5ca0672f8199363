"""The native decoder step (backend/model/native_step.py, backend/kernels/decoder_step.cpp) against the model's one
definition, its eager layers: which models run it, the same math within bf16 rounding, and rows whose bits
never depend on the step they ran in (prefill or decode, alone or beside other sequences, any split of a
prompt). The engine-level invariance scenarios run it too (tests/backend/test_batch_invariance.py, "int4")."""

from __future__ import annotations

import pytest
import torch

from backend.attention.context import AttentionContext
from backend.kernels import load
from backend.model.llama import LlamaModel, _causal_attention
from backend.model.native_step import PagedStep, sequence_step
from backend.model.quant import Int4Linear, quantize_model
from harness.models.tiny import tiny_config, tiny_model, tiny_weights
from tests.backend.test_quant import Q4, _quantized_tiny, gguf_blocks

needs_kernel = pytest.mark.skipif(
    load.amx_unavailable() is not None, reason="needs tokenedge's int4 kernel (AVX512-VNNI/BF16)"
)
BLOCK = 16


def int4_model() -> LlamaModel:
    model = _quantized_tiny(with_blocks=True)
    assert isinstance(model, LlamaModel)
    return model


def caches(model: LlamaModel, blocks: int = 16) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    c = model.config
    shape = (blocks, BLOCK, c.num_kv_heads, c.head_dim)  # [num_blocks, block_size, KH, D]
    return (
        [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(c.num_layers)],
        [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(c.num_layers)],
    )


def native(model: LlamaModel, ids: list[int], positions: list[int], step: PagedStep) -> torch.Tensor:
    def unused(_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the native step attends itself")

    return model(torch.tensor(ids), torch.tensor(positions), unused, False, step)  # [T, hidden]


def rand_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@needs_kernel
def test_only_a_model_on_tokenedges_int4_kernel_runs_natively() -> None:
    assert int4_model().native_stack() is not None
    assert _quantized_tiny(with_blocks=False).native_stack() is None  # type: ignore[operator]  # int8
    assert tiny_model(seed=3).native_stack() is None
    assert tiny_model(seed=3, dtype=torch.bfloat16).native_stack() is None
    fp32 = tiny_model(seed=3)  # int4 projections, but an fp32 model: its pool is fp32, the step's is bf16
    weights = tiny_weights(tiny_config())
    blocks = {n: gguf_blocks(w, Q4[1])[0] for n, w in weights.items() if w.dim() == 2 and "embed" not in n}
    quantize_model(fp32, weights, blocks)
    assert isinstance(fp32.layers[0].self_attn.qkv_proj, Int4Linear) and fp32.native_stack() is None


def test_torchs_int4_kernel_keeps_the_eager_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(load.ENV, "torch")
    load.int4_kernel.cache_clear()
    try:
        assert int4_model().native_stack() is None
    finally:
        load.int4_kernel.cache_clear()


@needs_kernel
def test_the_native_step_computes_the_eager_layers_math() -> None:
    """A 45-token prefill: the hidden states of the eager layers (the same int4 products) within bf16 rounding."""
    model = int4_model()
    ids = rand_ids(45, seed=1)
    k, v = caches(model)
    got = native(model, ids, list(range(45)), sequence_step(45, BLOCK, k, v))
    assert k[1][2, 12].abs().sum() > 0  # the native step ran: it wrote token 44's keys into the pool
    eager = model(torch.tensor(ids), torch.arange(45), lambda _l, q, k, v: _causal_attention(q, k, v))
    rel = ((got - eager).norm(dim=1) / eager.norm(dim=1)).max().item()
    assert rel < 2e-2, f"largest relative row difference {rel}"


@needs_kernel
def test_a_decode_gives_the_bits_of_the_same_token_in_a_prefill() -> None:
    """Prefill 33 tokens, then decode the 34th from the cache: the same row as a 34-token prefill's last."""
    model = int4_model()
    ids = rand_ids(34, seed=2)
    whole = native(model, ids, list(range(34)), sequence_step(34, BLOCK, *caches(model)))
    k, v = caches(model)
    native(model, ids[:33], list(range(33)), sequence_step(33, BLOCK, k, v))
    decode = dataclass_ctx(slots=[33], tables=[[0, 1, 2]], lens=[34], query_lens=[1])
    last = native(model, ids[33:], [33], PagedStep(decode, k, v))
    assert torch.equal(last, whole[33:])


@needs_kernel
def test_a_sequences_rows_do_not_depend_on_the_other_sequence_in_its_step() -> None:
    """Two prompts in one step (the second's blocks after the first's) give each prompt's rows alone."""
    model = int4_model()
    a, b = rand_ids(20, seed=3), rand_ids(37, seed=4)
    alone_a = native(model, a, list(range(20)), sequence_step(20, BLOCK, *caches(model)))
    alone_b = native(model, b, list(range(37)), sequence_step(37, BLOCK, *caches(model)))
    both = dataclass_ctx(
        slots=[*range(20), *range(32, 69)], tables=[[0, 1, 0], [2, 3, 4]], lens=[20, 37], query_lens=[20, 37]
    )
    together = native(model, a + b, [*range(20), *range(37)], PagedStep(both, *caches(model)))
    assert torch.equal(together[:20], alone_a) and torch.equal(together[20:], alone_b)


@needs_kernel
def test_a_norm_weight_change_rebuilds_the_native_stack() -> None:
    model = int4_model()
    first = model.native_stack()
    with torch.no_grad():
        model.layers[1].input_layernorm.weight.mul_(2)
    second = model.native_stack()
    assert second is not None and second is not first
    assert torch.equal(second.weights[10], model.layers[1].input_layernorm.weight.float())


def dataclass_ctx(
    slots: list[int], tables: list[list[int]], lens: list[int], query_lens: list[int]
) -> AttentionContext:
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return AttentionContext(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        query_lens=tuple(query_lens),
        context_lens_host=tuple(lens),
        block_size=BLOCK,
    )
