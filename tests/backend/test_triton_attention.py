"""The Triton paged attention kernel (backend/attention/triton_kernel.py) against the naive paged reference, on CPU
under Triton's interpreter: decode, prefill over a cached prefix, GQA, shuffled block tables, garbage in unused
slots, a strided query, head sizes 64 and 128, any block size, batch invariance, and a planted mask off-by-one
that the comparison catches. Shapes are small: the interpreter runs each program in numpy."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (it reads it when a kernel is defined)

import numpy as np
import pytest
import torch

from backend.attention import triton_paged
from backend.attention.context import AttentionContext
from backend.attention.reference import reference_paged_attention
from backend.attention.triton_paged import TritonPagedBackend

MIXED = ([1, 1, 20, 7, 1], [1, 37, 20, 40, 16])


@pytest.fixture(autouse=True)
def row_wise_interpreter_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's `tl.dot` as a GPU's MMA computes it: each output row alone, whatever its place in the tile.

    Triton's interpreter hands a whole tile to `np.matmul`, i.e. to the BLAS numpy was built with, whose kernel is
    chosen by the CPU at hand (OpenBLAS's DYNAMIC_ARCH): its Haswell kernel rounds a row differently by its position
    in a 16-row tile (its SkylakeX and Sandybridge kernels do not), which a GPU never does. The emulation, not the
    kernel, would then decide the bit-equality checks below: they run the tile row by row."""
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # type: ignore[no-untyped-def]
        if a.data.ndim != 2 or a.dtype.primitive_bitwidth == 8:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        rows = [np.matmul(a.data[i : i + 1], b.data, dtype=d.data.dtype) for i in range(a.data.shape[0])]
        return interpreter.TensorHandle(np.concatenate(rows) + d.data, d.dtype.scalar)

    monkeypatch.setattr(
        interpreter.InterpreterBuilder, "create_dot", create_dot
    )  # decodes, a fresh prefill, a chunk over a cached prefix


GARBAGE = (float("nan"), 1e30)


def pool_step(
    query_lens: list[int],
    context_lens: list[int],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    garbage: float | None = None,
    seed: int = 0,
) -> tuple[AttentionContext, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step over a pool whose sequences own shuffled blocks; with `garbage`, every slot outside a sequence's
    cached prefix and every padding entry of the block tables holds it (or points at a block full of it)."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(needed) + 3
    shape = (num_blocks, block_size, kv_heads, head_dim)
    fill = float("nan") if garbage is None else garbage
    k_cache, v_cache = torch.full(shape, fill), torch.full(shape, fill)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    spare = order.pop()  # a block nobody owns: the tables' padding points at it
    tables = [[order.pop() for _ in range(n)] for n in needed]
    for table, n, length in zip(tables, query_lens, context_lens, strict=True):
        for p in range(length - n):  # the cached prefix; the new tokens are written by forward
            k_cache[table[p // block_size], p % block_size] = torch.randn(kv_heads, head_dim, generator=gen)
            v_cache[table[p // block_size], p % block_size] = torch.randn(kv_heads, head_dim, generator=gen)
    if garbage is None:  # the unused slots get ordinary values
        unused = k_cache.isnan()
        k_cache[unused] = torch.randn(int(unused.sum()), generator=gen)
        v_cache[unused] = torch.randn(int(unused.sum()), generator=gen)
    width = max(needed) + 1
    padded = [t + [spare if garbage is not None else 0] * (width - len(t)) for t in tables]
    slots = [t[p // block_size] * block_size + p % block_size for t, n, c in zip(tables, query_lens, context_lens, strict=True) for p in range(c - n, c)]  # fmt: skip
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    ctx = AttentionContext(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor(padded, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        query_lens=tuple(query_lens),
        context_lens_host=tuple(context_lens),
        block_size=block_size,
    )
    total = sum(query_lens)
    q = torch.randn(total, heads, head_dim, generator=gen)
    k = torch.randn(total, kv_heads, head_dim, generator=gen)
    v = torch.randn(total, kv_heads, head_dim, generator=gen)
    return ctx, q.to(dtype), k.to(dtype), v.to(dtype), k_cache.to(dtype), v_cache.to(dtype)


def run(step: tuple, **backend: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[type-arg]
    """(the kernel's output, the reference's) for one step."""
    ctx, q, k, v, k_cache, v_cache = step
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], k_cache.shape[2]
    kernel = TritonPagedBackend(heads, kv_heads, head_dim, ctx.block_size, **backend)
    out = kernel.forward(q, k, v, k_cache, v_cache, kernel.plan(ctx))
    return out, reference_paged_attention(q, k_cache, v_cache, ctx)


def close(out: torch.Tensor, expected: torch.Tensor) -> bool:
    tol = 1e-5 if out.dtype == torch.float32 else 2e-2
    return bool(torch.allclose(out.float(), expected.float(), atol=tol, rtol=tol))


@pytest.mark.parametrize(
    "query_lens, context_lens",
    [([1, 1, 1, 1], [1, 16, 17, 70]), ([9], [9]), ([5, 3], [40, 19]), MIXED],
    ids=["decode", "fresh-prefill", "prefill-over-cached-prefix", "mixed"],
)
def test_matches_the_reference(query_lens: list[int], context_lens: list[int]) -> None:
    out, expected = run(pool_step(query_lens, context_lens))
    assert close(out, expected), (out - expected).abs().max()


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (9, 3), (4, 4), (16, 1)], ids=["G4", "G3", "MHA", "MQA"])
def test_grouped_query_heads(heads: int, kv_heads: int) -> None:
    out, expected = run(pool_step(*MIXED, heads=heads, kv_heads=kv_heads))
    assert close(out, expected), (out - expected).abs().max()


@pytest.mark.parametrize("block_size", [1, 7, 32])
def test_any_block_size(block_size: int) -> None:
    out, expected = run(pool_step([1, 6, 1], [30, 25, 3], block_size=block_size))
    assert close(out, expected), (out - expected).abs().max()


def test_block_tables_are_shuffled_and_still_match() -> None:
    step = pool_step(*MIXED, block_size=4)
    tables = step[0].block_tables
    assert any(row.diff().le(0).any() for row in tables)  # the blocks are not in pool order
    out, expected = run(step)
    assert close(out, expected)


@pytest.mark.parametrize("garbage", GARBAGE, ids=["nan", "huge"])
def test_garbage_in_unused_slots_and_table_padding_never_reaches_a_result(garbage: float) -> None:
    step = pool_step(*MIXED, garbage=garbage)
    out, expected = run(step)
    assert torch.isfinite(out).all()
    assert close(out, expected)


def test_a_strided_query_is_read_in_place() -> None:
    ctx, q, k, v, k_cache, v_cache = pool_step(*MIXED)
    heads, head_dim = q.shape[1], q.shape[2]
    # a fused projection: q is a view of its first columns
    qkv = torch.randn(q.shape[0], (heads + 4) * head_dim)
    qkv[:, : heads * head_dim] = q.flatten(1)
    strided = qkv[:, : heads * head_dim].view(-1, heads, head_dim)
    assert not strided.is_contiguous()
    out, expected = run((ctx, strided, k, v, k_cache, v_cache))
    assert close(out, expected)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_heads_of_64_and_128(head_dim: int, dtype: torch.dtype) -> None:
    out, expected = run(pool_step([1, 5], [33, 21], heads=6, kv_heads=2, head_dim=head_dim, dtype=dtype))
    assert out.dtype == dtype
    assert close(out, expected), (out.float() - expected.float()).abs().max()


def test_a_head_dim_that_is_not_a_power_of_two() -> None:
    out, expected = run(pool_step([1, 4], [20, 9], head_dim=24))
    assert close(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_other_rows(dtype: torch.dtype) -> None:
    """Each sequence of a mixed step, run alone over the same pool, gets the very bits it got in the step."""
    ctx, q, k, v, k_cache, v_cache = pool_step(*MIXED, dtype=dtype, garbage=float("nan"))
    together, _ = run((ctx, q, k, v, k_cache, v_cache))
    starts = ctx.query_start_host
    for i, (n, length) in enumerate(zip(ctx.query_lens, ctx.context_lens_host, strict=True)):
        rows = slice(starts[i], starts[i] + n)
        alone_ctx = AttentionContext(
            slot_mapping=ctx.slot_mapping[rows],
            block_tables=ctx.block_tables[i : i + 1],
            context_lens=ctx.context_lens[i : i + 1],
            query_start_loc=torch.tensor([0, n], dtype=torch.int32),
            query_lens=(n,),
            context_lens_host=(length,),
            block_size=ctx.block_size,
        )
        alone, _ = run((alone_ctx, q[rows].clone(), k[rows], v[rows], k_cache.clone(), v_cache.clone()))
        assert torch.equal(alone, together[rows]), f"sequence {i}"


def test_a_decode_token_gets_the_bits_of_the_same_token_inside_a_prefill_chunk() -> None:
    """The invariance the engine's contract needs (docs/design.md §8): the last token of a 7-token chunk and the same
    token decoded alone (its prefix cached) attend with the same bits."""
    ctx, q, k, v, k_cache, v_cache = pool_step([7], [40])
    chunk, _ = run((ctx, q, k, v, k_cache, v_cache))
    table, block_size = ctx.block_tables[0].tolist(), ctx.block_size
    decode_ctx = AttentionContext(
        slot_mapping=ctx.slot_mapping[-1:],
        block_tables=ctx.block_tables,
        context_lens=ctx.context_lens,
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        query_lens=(1,),
        context_lens_host=(40,),
        block_size=block_size,
    )
    assert decode_ctx.slot_mapping.item() == table[39 // block_size] * block_size + 39 % block_size
    decode, _ = run((decode_ctx, q[-1:].clone(), k[-1:], v[-1:], k_cache, v_cache))
    assert torch.equal(decode, chunk[-1:])


@pytest.mark.parametrize("shift", [1, -1])
@pytest.mark.parametrize(
    "query_lens, context_lens", [([1, 1], [19, 40]), ([6], [30])], ids=["decode", "prefill"]
)
def test_a_planted_off_by_one_in_the_mask_fails_the_comparison(
    monkeypatch: pytest.MonkeyPatch, shift: int, query_lens: list[int], context_lens: list[int]
) -> None:
    """The mutation check: the comparison above is strong enough to see the mask move by one key."""
    step = pool_step(query_lens, context_lens)
    out, expected = run(step)
    assert close(out, expected)
    monkeypatch.setattr(triton_paged, "MASK_SHIFT", shift)
    mutated, expected = run(step)
    assert not close(mutated, expected)
